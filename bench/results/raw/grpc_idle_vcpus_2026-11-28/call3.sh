#!/usr/bin/env bash
# Call 3: work starts made once a step (tests), and what the host's CPU idle states do to gRPC's hops.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 250 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]|seed|Expected|Which is" $L/$t.log | head -12
done
{
  echo "governor: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>&1) driver: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_driver 2>&1)"
  echo "cpuidle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>&1) governor: $(cat /sys/devices/system/cpu/cpuidle/current_governor_ro 2>&1)"
  for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do echo "$s: $(cat $s/name 2>&1) latency $(cat $s/latency 2>&1) us, disabled $(cat $s/disable 2>&1)"; done
  grep -m1 "model name" /proc/cpuinfo; nproc; grep MHz /proc/cpuinfo | head -4
  ls -la /dev/cpu_dma_latency 2>&1
} > $L/cpu.txt 2>&1
cat $L/cpu.txt
run_bench() { timeout 100 grpc_stream_bench --requests 300 > $L/grpc_$1.txt 2>&1; echo "== $1 rc=$? ${SECONDS}s"; grep -iE "transit|inbound|sync|callback" $L/grpc_$1.txt | tail -6; }
run_bench idle1
/usr/bin/python3 -c "
import os,struct,time
fd=os.open('/dev/cpu_dma_latency', os.O_WRONLY); os.write(fd, struct.pack('i',0)); print('holding cpu_dma_latency 0', flush=True); time.sleep(100)" > $L/dma.txt 2>&1 &
dma=$!; sleep 1; cat $L/dma.txt
run_bench dma0
grep MHz /proc/cpuinfo | head -4 >> $L/cpu.txt
kill $dma 2>/dev/null; wait $dma 2>/dev/null
pids=(); for i in $(seq 16); do nice -n 19 sh -c 'while :; do :; done' & pids+=($!); done
run_bench spin16
kill ${pids[@]}; wait 2>/dev/null
run_bench idle2
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
