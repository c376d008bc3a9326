#!/usr/bin/env bash
# Issue 25, session 23, call 4: main's GEMMs of a few-row step in isolation on the H200
# (Nsight Compute, serialized): the first four tensor-core skinny launches (the first cached
# TTFT's layer 0 at 16 rows: QKV, output, gate/up, down) and the first four one-row CUDA-core
# ones (a decode step's), each's duration and DRAM read rate.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
echo "ncu: $ncu"
m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_read.sum.per_second,sm__cycles_active.avg,sm__cycles_elapsed.avg,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active
for k in SkinnyMmaGemmKernel SkinnyGemmKernel; do
  timeout 280 $ncu --clock-control none -k regex:"^$k" -c 4 --metrics $m --csv cuda_backend_bench > $logs/ncu_$k.csv 2> $logs/ncu_$k.err
  echo "$k rc=$? ($(el))"
  grep -E '"(gpu__time_duration.sum|dram__bytes_read.sum|dram__bytes_read.sum.per_second|launch__grid_size|sm__cycles_active.avg|sm__cycles_elapsed.avg)"' $logs/ncu_$k.csv | awk -F'","' '{print $1"|"$5"|"$(NF-2)"|"$(NF-1)"|"$NF}' | sed 's/"//g' | cut -c1-160
done
echo "done ($(el))"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
