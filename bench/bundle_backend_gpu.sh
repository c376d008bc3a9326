#!/usr/bin/env bash
# Packs the CUDA backend's tests and benchmark for the GPU machine, without cuBLAS/cuBLASLt
# (libcublasLt alone is over 500 MiB; the machine's CUDA toolkit has the same major
# version): ../shared/tools/gpu-bundle with those libraries skipped, and env.sh told where
# the machine keeps them.
# usage: bench/bundle_backend_gpu.sh OUTDIR [BUILD_DIR [PROGRAM...]]   (default: every GPU
# test, cuda_backend_bench and lazykv; name fewer to pack only what is built), then on the device:
#   bash OUTDIR/data/run_backend_gpu.sh OUTDIR   (the run script travels in the bundle)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
build=${2:-build}
programs=("${@:3}")
[[ ${#programs[@]} -gt 0 ]] || programs=(cuda_model_ops_test cuda_generic_attention_test cuda_backend_test cuda_chunk_transfer_test
  cuda_fp32_backend_test cuda_kernels_test cuda_prefill_test cuda_sampling_test cuda_output_layer_test cuda_warm_up_test cuda_backend_bench cuda_prefill_bench
  cuda_shared_decode_test shared_decode_bench cuda_sm_clock_test lazykv)
tool=$here/../../shared/tools/gpu-bundle
[[ -x $tool ]] || tool=/work/shared/tools/gpu-bundle
patched=$(mktemp)
sed 's#libnvidia\[^/\]\*)#libnvidia[^/]*|libcublas|libcublasLt)#' "$tool" > "$patched"
chmod +x "$patched"
models=${LAZYKV_MODELS_DIR:-$(dirname "$tool")/../models}
(cd "$build/bin" && "$patched" "$out" "${programs[@]}" -- "$models/stories260K.bin" "$models/tok512.bin" "$here/run_backend_gpu.sh" "$here/torch_prefill_reference.py" \
  "$here/sdpa_prefill_reference.py")
rm -f "$patched"
# The programs travel compressed too (their CUDA code shrinks about 6x), so a call's 64 MiB
# carries the whole default set; env.sh unpacks them on the machine.
tar -C "$out" -cf - bin | xz -T0 -6 > "$out/bin.tar.xz"
rm -rf "$out/bin"
cat >> "$out/env.sh" <<'ENV'
[[ -d $_here/bin ]] || tar -C "$_here" -xJf "$_here/bin.tar.xz"
# cuBLAS(Lt) is not bundled: the machine's CUDA toolkit (or PyTorch's wheels) has it
for _d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib 2>/dev/null); do
  [[ -e $_d/libcublasLt.so.13 ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$_d"
done
ENV
