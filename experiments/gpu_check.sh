#!/usr/bin/env bash
# The project's GPU checks in one run (about 9 minutes on an NVIDIA H200):
#   1. lbm_performance --full: the fused GPU step's MLUPs on D2Q9 4096^2 and
#      D3Q19 256^3 against FluidX3D's published H200 figures (checked there);
#   2. experiments.gpu_lbm_check: fused vs XLA step on the GPU, in place vs two
#      buffers, a 1500^3 FP16S grid in place, the capsule case;
#   3. the backend-sensitive tests (pytest -m backend, see tests/conftest.py);
#   4. the mixed-precision benchmark at GPU scale (experiments.amp_gpu);
#   5. free_surface: the GPU free-surface step's MLUPs beside the plain step's
#      (D3Q19 256^3, FP32 and FP16S; fails below the 0.4 ratio).
# Not in the default list (run it alone, it takes most of a command's time):
#   raindrop: the paper's raindrop at D = 84 for the full 3 ms, which must finish
#      within 10 minutes (python -m lbm_jax run raindrop --n 84).
# Each part is time-limited and logs to OUT_DIR/<part>.log; the exit status is
# non-zero when any part fails.
# Usage: bash experiments/gpu_check.sh OUT_DIR [PART ...]
set -u
out=${1:?usage: bash experiments/gpu_check.sh OUT_DIR [PART ...]}
shift
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(lbm_performance gpu_lbm_check tests amp free_surface)
mkdir -p "$out"
status=0

run_part() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s)"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 30 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || status=1
}

for part in "${parts[@]}"; do
    case $part in
    lbm_performance)
        run_part "$part" 150 python -m experiments lbm_performance --full \
            --out "$out/lbm_performance" ;;
    gpu_lbm_check)
        run_part "$part" 130 python -m experiments.gpu_lbm_check \
            --parts agreement,large,capsule --out "$out/gpu_lbm_check" ;;
    tests)
        run_part "$part" 200 python -m pytest -m "backend and not slow" -q \
            -p no:cacheprovider ;;
    amp)
        run_part "$part" 230 python -m experiments.amp_gpu --scale gpu \
            --out "$out/amp_gpu" ;;
    free_surface)
        run_part "$part" 150 python -m lbm_jax.bench_free_surface --n 256 \
            --storage fp32,fp16s --rounds 3 --repeats 3 --backend gpu \
            --json "$out/free_surface.json" ;;
    raindrop)
        run_part "$part" 600 python -m lbm_jax run raindrop --n 84 \
            --out "$out/raindrop" --checkpoint-every 2000 ;;
    *)
        echo "unknown part $part" >&2
        status=2 ;;
    esac
done
exit "$status"
