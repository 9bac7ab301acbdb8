#!/usr/bin/env bash
# GRPO (or any method config) on Qwen3-30B-A3B over one or more 8xH100 nodes, slime's reference layout
# (docs/cluster.md): TP 4 + sequence parallel, EP 8, PP 1, full recompute, 20480 tokens per GPU,
# optimizer CPU offload, one SGLang engine (TP 8) per node, engines behind a router when NNODES > 1.
# The trainer loads HF_CKPT's weights into megatron-core at setup (no conversion step).
#
#   head:    NODE_RANK=0 NNODES=2 HF_CKPT=/ckpt/Qwen3-30B-A3B bash scripts/run-qwen3-30B-A3B.sh [key=value ...]
#   worker:  NODE_RANK=1 NNODES=2 MASTER_ADDR=<head ip> bash scripts/run-qwen3-30B-A3B.sh
#   check:   bash scripts/run-qwen3-30B-A3B.sh --dry-run [key=value ...]     (or DRY_RUN=1; starts nothing)
#   cpu:     HF_CKPT=/ckpt/tiny bash scripts/run-qwen3-30B-A3B.sh --cpu [key=value ...]   (or CPU_RUN=1)
#
# Env: NODE_RANK (0 = head, default 0), NNODES (default 1), MASTER_ADDR (head address, workers only),
# RAY_PORT (default 6379), GPUS_PER_NODE (default 8; fewer for a smaller layout, with the parallel sizes
# and sglang.tp_size overridden to fit, e.g. LoRA RL on 2 GPUs: docs/lora.md), HF_CKPT (HF checkpoint dir: weights, config.json, tokenizer), METHOD_CONFIG
# (default configs/grpo.yaml), MODEL_CONFIG (the model fragment: a YAML file, or `checkpoint` for one
# written from HF_CKPT/config.json; default configs/models/qwen3-30b-a3b.yaml, with --cpu `checkpoint`),
# RUN_DIR (where the composed config and plan.txt go; default runs/launch/qwen3-30b-a3b-<time>), VENV
# (default .venv), SKIP_SETUP=1 (do not run scripts/setup.sh), WAIT_FOR_NODES_S (head: how long to wait
# for all GPUs to join, default 900), SCORING_GPUS (GPUs a method's scoring servers take for themselves, e.g.
# on-policy distillation's teacher: left out of the trainer's DP and the engine count; default 0).
#
# --cpu: one machine without GPUs (a test of the launch path): configs/cluster/local-cpu.yaml instead of
# the H100 fragment (gloo trainer ranks sized by the train.parallel overrides), NNODES=1, no `ray start`
# (the driver starts a local Ray), no GPU check. Both modes print the plan and write it to RUN_DIR/plan.txt.
#
# The run config is a small generated YAML that extends the method file and includes the model and
# cluster fragments (absolute paths), so `key=value` overrides and validation work as for any config.
# The checkpoint's config.json is the architecture the trainer builds; model.* values of the fragment
# that differ from it are named in a warning and not used. To start RL from HF_CKPT as it is, list no
# sft stage (run.stages=[data,tokenizer,rl,eval]) or set sft.steps=0.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"  # configs/cluster/h100x8-qwen3-30b-a3b.yaml's; fewer: smaller layouts (LoRA)
CLUSTER_CONFIG="$ROOT/configs/cluster/h100x8-qwen3-30b-a3b.yaml"

log() { printf '[run-qwen3-30B-A3B] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }  # the header

# -- arguments ---------------------------------------------------------------------------------------
DRY_RUN="${DRY_RUN:-0}"
CPU_RUN="${CPU_RUN:-0}"
OVERRIDES=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --cpu) CPU_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option '$arg' (options: --dry-run, --cpu, --help; everything else is key=value)" ;;
    *=*) OVERRIDES+=("$arg") ;;
    *) die "argument '$arg' is not a key=value override" ;;
  esac
done

NODE_RANK="${NODE_RANK:-0}"
SCORING_GPUS="${SCORING_GPUS:-0}"
[[ "$SCORING_GPUS" =~ ^[0-9]+$ ]] || die "SCORING_GPUS must be a non-negative integer, got '$SCORING_GPUS'"
NNODES="${NNODES:-1}"
RAY_PORT="${RAY_PORT:-6379}"
VENV="${VENV:-$ROOT/.venv}"
export VENV
PY="$VENV/bin/python"
[[ "$NNODES" =~ ^[1-9][0-9]*$ ]] || die "NNODES must be a positive integer, got '$NNODES'"
[[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_NODE must be a positive integer, got '$GPUS_PER_NODE'"
[[ "$NODE_RANK" =~ ^[0-9]+$ ]] && (( NODE_RANK < NNODES )) || die "NODE_RANK must lie in [0, NNODES=$NNODES), got '$NODE_RANK'"
if [[ "$CPU_RUN" == 1 ]]; then
  (( NNODES == 1 )) || die "--cpu runs on one machine: NNODES must be 1, got $NNODES"
  GPUS_PER_NODE=0  # configs/cluster/local-cpu.yaml
  CLUSTER_CONFIG="$ROOT/configs/cluster/local-cpu.yaml"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # one torch thread per process, as local-cpu.yaml's threads
fi

# A relative METHOD_CONFIG / MODEL_CONFIG is read from the caller's directory first, then from the repository.
resolve_config() {
  local name="$1" path="$2"
  if [[ "$path" != /* ]]; then
    if [[ -f "$PWD/$path" ]]; then path="$PWD/$path"; else path="$ROOT/$path"; fi
  fi
  [[ -f "$path" ]] || die "$name not found: $2"
  printf '%s\n' "$(cd "$(dirname "$path")" && pwd)/$(basename "$path")"
}
METHOD_CONFIG="$(resolve_config METHOD_CONFIG "${METHOD_CONFIG:-configs/grpo.yaml}")"
if [[ "$CPU_RUN" == 1 ]]; then MODEL_CONFIG="${MODEL_CONFIG:-checkpoint}"; fi
MODEL_CONFIG="${MODEL_CONFIG:-configs/models/qwen3-30b-a3b.yaml}"
if [[ "$MODEL_CONFIG" != checkpoint ]]; then
  MODEL_CONFIG="$(resolve_config MODEL_CONFIG "$MODEL_CONFIG")"
fi
cd "$ROOT"

# The last override of a key wins, as in the config loader.
override_value() {
  local key="$1" default="$2" value="$2" item
  for item in ${OVERRIDES[@]+"${OVERRIDES[@]}"}; do
    [[ "$item" == "$key="* ]] && value="${item#*=}"
  done
  printf '%s\n' "${value:-$default}"
}
TP="$(override_value train.parallel.tensor_model_parallel_size 4)"
PP="$(override_value train.parallel.pipeline_model_parallel_size 1)"

if [[ -z "${HF_CKPT:-}" ]]; then
  [[ "$DRY_RUN" == 1 ]] || die "set HF_CKPT to the Qwen3-30B-A3B checkpoint directory (HF format)"
  HF_CKPT="/path/to/Qwen3-30B-A3B"
  log "warning: HF_CKPT is not set; the dry run uses the placeholder $HF_CKPT"
fi
HF_CKPT="${HF_CKPT%/}"

# -- config ------------------------------------------------------------------------------------------
yaml_str() { local s="${1//\'/\'\'}"; printf "'%s'" "$s"; }

# The model fragment for a config written to directory $1: MODEL_CONFIG, or with MODEL_CONFIG=checkpoint
# $1/model.yaml written from HF_CKPT/config.json.
model_fragment() {
  local dir="$1"
  if [[ "$MODEL_CONFIG" != checkpoint ]]; then
    printf '%s\n' "$MODEL_CONFIG"
    return
  fi
  [[ -f "$HF_CKPT/config.json" ]] || die "MODEL_CONFIG=checkpoint needs HF_CKPT/config.json ($HF_CKPT/config.json not found; set HF_CKPT, or MODEL_CONFIG to a model fragment)"
  "$PY" -c 'import sys; from slime_ext.orchestration.driver import model_fragment; sys.stdout.write(model_fragment(sys.argv[1]))' \
    "$HF_CKPT" > "$dir/model.yaml" || die "could not read the model section of $HF_CKPT/config.json"
  printf '%s\n' "$dir/model.yaml"
}

# Writes the composed YAML to $1. GPU runs: DP is written out (GPUs / (TP x PP)) so that every consumer
# sizes the trainer world the same way; the plan checks it against the layout. CPU runs: the trainer
# world is TP x PP x DP gloo processes (train.parallel overrides), one local machine, no router.
compose_config() {
  local out="$1" gpus=$(( NNODES * GPUS_PER_NODE - SCORING_GPUS )) router=false dp_line="" model engines
  model="$(model_fragment "$(dirname "$out")")"
  engines=$(( GPUS_PER_NODE > 0 ? gpus / GPUS_PER_NODE : NNODES ))
  (( engines > 1 )) && router=true
  if (( GPUS_PER_NODE > 0 && TP * PP > 0 && gpus % (TP * PP) == 0 )); then
    dp_line="    data_parallel_size: $(( gpus / (TP * PP) ))"
  fi
  {
    echo "# generated by scripts/run-qwen3-30B-A3B.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "extends: $(yaml_str "$METHOD_CONFIG")"
    echo "include:"
    echo "  - $(yaml_str "$model")"
    echo "  - $(yaml_str "$CLUSTER_CONFIG")"
    echo "cluster:"
    echo "  num_nodes: $NNODES"
    if (( GPUS_PER_NODE > 0 )); then echo "  gpus_per_node: $GPUS_PER_NODE"; fi
    echo "model:"
    echo "  hf_path: $(yaml_str "$HF_CKPT")"
    echo "tokenizer:"
    echo "  path: $(yaml_str "$HF_CKPT")"
    echo "sglang:"
    echo "  model_path: $(yaml_str "$HF_CKPT")"
    if (( GPUS_PER_NODE > 0 )); then
      echo "  num_engines: $engines  # one TP-8 engine per node the scoring servers leave"
      echo "  router: $router"
    fi
    if [[ -n "$dp_line" ]]; then
      echo "train:"
      echo "  parallel:"
      echo "$dp_line"
    fi
  } > "$out"
}

# The plan validates the config as `python -m slime_ext.config --check` does (exit 2 on a config or layout
# error, 3 when the layout does not fit), so one interpreter does both.
check_and_plan() {
  local config="$1"
  log "validating $config ${OVERRIDES[*]-}"
  "$PY" -m slime_ext.orchestration.plan "$config" ${OVERRIDES[@]+"${OVERRIDES[@]}"}
}

# Checks the checkpoint, composes the run config into RUN_DIR (default runs/launch/<$1>-<time>), validates
# it and prints the plan (kept as RUN_DIR/plan.txt). Sets RUN_DIR and CONFIG.
prepare_run_dir() {
  [[ -f "$HF_CKPT/config.json" ]] || die "HF_CKPT=$HF_CKPT has no config.json"
  RUN_DIR="${RUN_DIR:-$ROOT/runs/launch/$1-$(date +%Y%m%d-%H%M%S)}"
  mkdir -p "$RUN_DIR"
  CONFIG="$RUN_DIR/config.yaml"
  compose_config "$CONFIG"
  check_and_plan "$CONFIG" | tee "$RUN_DIR/plan.txt"
}

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  bash "$ROOT/scripts/setup.sh"
fi
[[ -x "$PY" ]] || die "no python at $PY (run scripts/setup.sh or set VENV)"

# -- dry run: validate and print the plan, start nothing ---------------------------------------------
if [[ "$DRY_RUN" == 1 ]]; then
  TMP_DIR="$(mktemp -d "${TMPDIR:-/tmp}/run-qwen3-30B-A3B.XXXXXX")"
  trap 'rm -rf "$TMP_DIR"' EXIT
  compose_config "$TMP_DIR/config.yaml"
  log "dry run (node $NODE_RANK of $NNODES$( [[ "$CPU_RUN" == 1 ]] && echo ", CPU" )): nothing is started"
  check_and_plan "$TMP_DIR/config.yaml"
  if [[ "$CPU_RUN" == 1 ]]; then
    log "dry run OK; a real run would run slime_ext.orchestration.driver here (it starts a local Ray)"
  else
    log "dry run OK; a real run would start Ray and run slime_ext.orchestration.driver (the trainer loads $HF_CKPT)"
  fi
  exit 0
fi

# -- CPU run: one machine, the driver starts a local Ray -----------------------------------------------
if [[ "$CPU_RUN" == 1 ]]; then
  prepare_run_dir "qwen3-30b-a3b-cpu"
  log "starting the job on this machine (CPU): config $CONFIG"
  exec "$PY" -m slime_ext.orchestration.driver "$CONFIG" ${OVERRIDES[@]+"${OVERRIDES[@]}"}
fi

# -- real run ----------------------------------------------------------------------------------------
command -v "$VENV/bin/ray" > /dev/null || die "ray is not installed in $VENV"
if command -v nvidia-smi > /dev/null 2>&1; then
  have="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  (( have >= GPUS_PER_NODE )) || die "this node has $have GPUs; the layout needs $GPUS_PER_NODE per node"
else
  die "nvidia-smi not found: this launcher needs $GPUS_PER_NODE GPUs per node (use --dry-run to check a config, --cpu to run on this machine's CPU)"
fi

if (( NODE_RANK > 0 )); then
  [[ -n "${MASTER_ADDR:-}" ]] || die "worker nodes need MASTER_ADDR (the head node's address)"
  log "worker $NODE_RANK/$NNODES joining the Ray head at $MASTER_ADDR:$RAY_PORT"
  exec "$VENV/bin/ray" start --address "$MASTER_ADDR:$RAY_PORT" --num-gpus "$GPUS_PER_NODE" --block
fi

prepare_run_dir "qwen3-30b-a3b"

log "starting the Ray head on port $RAY_PORT"
"$VENV/bin/ray" start --head --port "$RAY_PORT" --num-gpus "$GPUS_PER_NODE"

want=$(( NNODES * GPUS_PER_NODE ))
log "waiting up to ${WAIT_FOR_NODES_S:-900}s for $want GPUs ($NNODES nodes) to join"
"$PY" - "$want" "${WAIT_FOR_NODES_S:-900}" <<'EOF'
import sys, time
import ray
want, limit = int(sys.argv[1]), float(sys.argv[2])
ray.init(address="auto", logging_level="ERROR")
start = time.monotonic()
while (have := int(ray.cluster_resources().get("GPU", 0))) < want:
    if time.monotonic() - start > limit:
        sys.exit(f"only {have} of {want} GPUs joined the Ray cluster after {limit:.0f}s")
    time.sleep(5)
print(f"ray cluster ready: {have} GPUs", file=sys.stderr)
EOF

log "starting the job: config $CONFIG (the trainer ranks load their shards of $HF_CKPT at setup)"
exec "$PY" -m slime_ext.orchestration.driver "$CONFIG" cluster.ray_address=auto ${OVERRIDES[@]+"${OVERRIDES[@]}"}
