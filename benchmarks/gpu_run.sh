#!/usr/bin/env bash
# The GPU check in one command, for a lent machine with a CUDA GPU (issue 23):
#
#   OUT=/some/folder bash benchmarks/gpu_run.sh
#
# Uses the machine's python3 (or $PYTHON) and its torch as they are: nothing is installed, and
# the package runs from this checkout (PYTHONPATH; without its C files, which fall back to
# Python). Steps, in order, each under `timeout` and all within GPU_RUN_BUDGET seconds (default
# 285): the machine's facts, the cuda-marked tests, `calibrate --quick`, the host cost of
# PyTorch's GPU trace callbacks, light mode against the full tracer and a plain run
# (benchmarks/light_overhead.py: its table and JSON line go to log.txt), and fidelity (sim
# against the GPU, with the calibrated profile) on its --subset, GPU_RUN_JOBS runs side by side
# (default: the CPUs, 12 at most). A step runs even if the one before failed.
#
# $OUT (default gpu-run/) gets 8 files at most, the most a lent machine sends back:
#   summary.json           each step: command, time limit, exit status, wall seconds (rewritten
#                          after every step, so a run cut short still leaves one)
#   log.txt                every step's stdout and stderr, between "=== STEP" lines
#   cuda-tests.xml         the cuda tests' JUnit XML
#   calibrated.json        the measured device profile; measurements.json, its raw records
#   gpu-trace-cost.json    host ns per op with the trace callbacks off and on
#   fidelity.json          per program: sim and GPU sync calls, bytes, waits, times, paths
#   fidelity-traces.tar.gz every fidelity run's trace
#
# GPU_RUN_SIM=1 runs fidelity with --sim-only and light-overhead with --device sim, so that the
# whole plumbing can be run and timed on a machine without a GPU (where the steps that need one
# fail at once). Exit status: 0 when every step exited 0, else 1.
set -u
out=${OUT:-gpu-run}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
py=${PYTHON:-python3}
budget=${GPU_RUN_BUDGET:-285}
sim=${GPU_RUN_SIM:-0}
jobs=${GPU_RUN_JOBS:-$(( $(nproc) < 12 ? $(nproc) : 12 ))}
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
# output reaches log.txt as it is made (a step killed at its limit keeps what it printed);
# no network there: the Hugging Face libraries must not try it
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
log=$out/log.txt
: > "$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t_start=$(date +%s%N)
steps=()
failed=0

# seconds since t_start, or between two date +%s%N stamps, as D.DDD
secs() { local ns=$(( $2 - $1 )); printf '%d.%03d' $(( ns / 1000000000 )) \
    $(( ns % 1000000000 / 1000000 )); }
json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }

write_summary() {
    local joined="" s
    for s in "${steps[@]}"; do joined+="${joined:+,$'\n'}  $s"; done
    { printf '{"schema_version": 1, "sim": %s, "budget_s": %s, "python": %s,\n' \
          "$([ "$sim" = 1 ] && echo true || echo false)" "$budget" "$(json_str "$py")"
      printf ' "wall_s": %s, "steps": [\n%s\n]}\n' "$(secs "$t_start" "$(date +%s%N)")" \
          "$joined"; } > "$work/summary.json" && cp "$work/summary.json" "$out/summary.json"
}

# step NAME LIMIT_S CMD...: run CMD under `timeout` (SIGINT, so pytest and Python write what
# they have; SIGKILL 10 s later), at most LIMIT_S and never past the budget
step() {
    local name=$1 limit=$2 left rc t0 t1 timed_out=false
    shift 2
    left=$(( budget - ($(date +%s%N) - t_start) / 1000000000 ))
    (( limit > left )) && limit=$left
    if (( limit < 5 )); then
        echo "=== $name: not run, the budget of ${budget} s is spent" >> "$log"
        steps+=("{\"name\": \"$name\", \"exit\": null, \"timed_out\": false, \"wall_s\": 0, \
\"limit_s\": 0, \"command\": $(json_str "$*")}")
        failed=1
        write_summary
        return
    fi
    echo "=== $name (limit ${limit} s): $*" >> "$log"
    t0=$(date +%s%N)
    timeout -s INT -k 10 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    t1=$(date +%s%N)
    (( rc == 124 || rc == 137 )) && timed_out=true
    (( rc != 0 )) && failed=1
    echo "=== $name: exit $rc after $(secs "$t0" "$t1") s$([ $timed_out = true ] && \
        echo ", timed out")" >> "$log"
    steps+=("{\"name\": \"$name\", \"exit\": $rc, \"timed_out\": $timed_out, \"wall_s\": \
$(secs "$t0" "$t1"), \"limit_s\": $limit, \"command\": $(json_str "$*")}")
    write_summary
}

step nvidia-smi 15 nvidia-smi
step versions 30 "$py" - <<'EOF'
import importlib.metadata as md, os, platform, sys
import torch
import memcpy_doctor
from memcpy_doctor.tracer import producers
from memcpy_doctor.tracer.sim import marks
print("python", sys.version.split()[0], platform.platform(), "cpus", os.cpu_count())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available",
      torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
print("memcpy_doctor", os.path.dirname(memcpy_doctor.__file__), "C files compiled:",
      "producers", producers.COMPILED, "marks", marks.COMPILED)
for name in ("transformers", "lightning", "accelerate", "torchmetrics", "timm", "torchvision",
             "pytest", "hypothesis", "pandas", "click", "tabulate", "pytest-xdist"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
EOF
step cuda-tests 120 "$py" -m pytest -q -p no:cacheprovider -m cuda -rfE \
    -o faulthandler_timeout=60 --junitxml="$out/cuda-tests.xml" tests
step calibrate 60 "$py" -m memcpy_doctor calibrate --quick -o "$out/calibrated.json" \
    --measurements "$out/measurements.json"
step gpu-trace-cost 45 "$py" benchmarks/gpu_trace_cost.py -n 10000 --repeats 3 \
    --json "$out/gpu-trace-cost.json"
sim_device=()
[ "$sim" = 1 ] && sim_device=(--device sim)
step light-overhead 45 "$py" benchmarks/light_overhead.py "${sim_device[@]}" --iters 200 \
    --repeats 3

# fidelity's simulated side: the profile just measured, else the shipped one of this GPU
profile=$out/calibrated.json
if [ ! -s "$profile" ]; then
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)" in
        *H200*) profile=h200-sxm-141gb ;;
        *H100*) profile=h100-sxm5-80gb ;;
        *) profile=a100-sxm4-80gb ;;
    esac
fi
left=$(( budget - ($(date +%s%N) - t_start) / 1000000000 ))
limit=$(( left < 150 ? left : 150 ))
sim_only=()
[ "$sim" = 1 ] && sim_only=(--sim-only)
# --deadline: fidelity stops starting and kills its runs 15 s before the step's limit, so it
# always prints its table and writes its JSON
step fidelity "$limit" "$py" benchmarks/fidelity.py "${sim_only[@]}" --subset --jobs "$jobs" \
    --timeout 90 --deadline $(( limit > 30 ? limit - 15 : limit / 2 )) \
    --device-profile "$profile" --json "$out/fidelity.json" --keep "$work/traces"
if [ -d "$work/traces" ]; then
    tar -czf "$out/fidelity-traces.tar.gz" -C "$work" traces
fi
write_summary
echo "=== done in $(secs "$t_start" "$(date +%s%N)") s; summary in $out/summary.json" >> "$log"
exit $failed
