#!/usr/bin/env bash
# Submit an evora run to a Ray cluster with the Ray Jobs API: this checkout is uploaded as
# the job's working dir and `evora <overrides>` runs on the head node.
#
#   launch/submit.sh hardware=multinode model=qwen2_5_7b task=countdown tracking.out_dir=/shared/runs
#   launch/submit.sh --address http://head-node:8265 hardware=multinode tracking=wandb tracking.wandb_project=my-project
#   launch/submit.sh --no-wait hardware=multinode strategy=ga model=qwen2_5_1_5b task=gsm8k
#   launch/submit.sh --logs raysubmit_XXXX            # follow a job's output
#   launch/submit.sh --help                           # every option
#
# WANDB_API_KEY and HF_TOKEN, when set here, reach the job through a private copy of
# launch/runtime_env.yaml (mode 600, outside the repository, removed on exit): never on the
# command line, where `ps` would show it to every user, and never in a file of the repo.
# Ray keeps a job's runtime env in its job info, readable through the dashboard: on a shared
# cluster use a Kubernetes Secret (k8s/rayjob.yaml) or `wandb login` on the nodes instead.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNTIME_ENV=launch/runtime_env.yaml
FORWARDED=(WANDB_API_KEY HF_TOKEN)  # secrets passed on from this environment when set

usage() {
  cat <<USAGE
usage: launch/submit.sh [--address URL] [--no-wait] [--dry-run] [--] <evora overrides>
       launch/submit.sh [--address URL] [--dry-run] --logs|--status|--stop JOB_ID

The address is --address, else \$RAY_ADDRESS (as with \`ray job\`, \$RAY_API_SERVER_ADDRESS first):
the head's dashboard, http://<head>:8265. Run folders go to tracking.out_dir on the head; the
default, runs/, is inside the job's temporary copy of this checkout: pass a shared path.

options:
  --address URL     Ray Jobs API address (default: \$RAY_API_SERVER_ADDRESS, else \$RAY_ADDRESS)
  --no-wait         submit and return; follow later with --logs JOB_ID
  --logs JOB_ID     follow a job's output (ray job logs -f)
  --status JOB_ID   print a job's status
  --stop JOB_ID     stop a job
  --dry-run         print the ray command instead of running it (secrets show as ***)
  -h, --help        this help

examples:
  export RAY_ADDRESS=http://head-node:8265
  launch/submit.sh hardware=multinode model=qwen2_5_7b task=countdown tracking.out_dir=/shared/runs
  launch/submit.sh hardware=multinode model=qwen2_5_1_5b task=gsm8k strategy=ga tracking=wandb tracking.out_dir=/shared/runs
  launch/submit.sh --no-wait -- -m hardware=multinode model=qwen2_5_0_5b task=countdown seed=0,1,2
  launch/submit.sh --logs raysubmit_XXXX
  launch/submit.sh --dry-run --address http://127.0.0.1:8265 model=tiny generations=2
USAGE
}

die() { echo "submit.sh: error: $*" >&2; exit 2; }

address=${RAY_API_SERVER_ADDRESS:-${RAY_ADDRESS:-}} no_wait=() dry_run=false action=submit job_id="" overrides=()
while (($#)); do
  case "$1" in
    --address) address=${2:-}; [[ -n $address ]] || die "--address needs a URL, e.g. http://head-node:8265"; shift 2 ;;
    --address=*) address=${1#*=}; shift ;;
    --no-wait) no_wait=(--no-wait); shift ;;
    --dry-run) dry_run=true; shift ;;
    --logs|--status|--stop) action=${1#--}; job_id=${2:-}; [[ -n $job_id ]] || die "$1 needs a job id"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; overrides+=("$@"); break ;;
    *) overrides+=("$1"); shift ;;  # evora's own arguments, -m and --cfg included
  esac
done
[[ -n $address ]] || die "no Ray address: set RAY_ADDRESS=http://<head>:8265 or pass --address"
if [[ $action != submit && ${#overrides[@]} -gt 0 ]]; then
  die "--$action takes a job id only, not evora overrides (${overrides[*]:-})"
fi

cd "$ROOT"  # the working dir uploaded is the repository, wherever this is run from
RAY=${RAY:-$(command -v ray || echo "$ROOT/.venv/bin/ray")}
[[ $dry_run == true ]] || command -v "$RAY" >/dev/null || die "ray not found: run make setup, or set RAY=/path/to/ray"
# Ray 2.60's job CLI sends the cluster's auth token (RAY_AUTH_TOKEN, or the file at
# RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) only when RAY_AUTH_MODE=token.
if [[ -z ${RAY_AUTH_MODE:-} && ( -n ${RAY_AUTH_TOKEN:-} || -f ${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token} ) ]]; then
  export RAY_AUTH_MODE=token
fi

run() {  # the command, or with --dry-run its text, quoted for a shell where needed
  [[ $dry_run == true ]] || { "$@"; return; }
  local words=() word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then words+=("$word")
    else words+=("'${word//\'/\'\\\'\'}'"); fi  # single-quoted; a ' inside becomes '\''
  done
  echo "${words[*]}"
}

case $action in
  logs) run "$RAY" job logs --address "$address" --follow "$job_id"; exit ;;
  status) run "$RAY" job status --address "$address" "$job_id"; exit ;;
  stop) run "$RAY" job stop --address "$address" "$job_id"; exit ;;
esac

secrets=()
for name in "${FORWARDED[@]}"; do if [[ -n ${!name:-} ]]; then secrets+=("$name"); fi; done
runtime_env=$RUNTIME_ENV
if ((${#secrets[@]})); then
  # `ray job submit` takes --runtime-env or --runtime-env-json, not both (Ray 2.60): the
  # secrets go into a merged copy of the YAML, readable by this user only.
  if [[ $dry_run == true ]]; then
    runtime_env="<private copy of $RUNTIME_ENV + ${secrets[*]/%/=***}>"
  else
    private=$(mktemp -d "${TMPDIR:-/tmp}/evora-submit.XXXXXX")
    trap 'rm -rf "$private"' EXIT
    trap 'exit 130' INT TERM  # exit, so that the EXIT trap removes the copy
    ray_python=$(sed -n '1s/^#!//p' "$(command -v "$RAY")")  # the python that runs ray has PyYAML
    read -r -a ray_python <<<"${ray_python:-python3}"
    (umask 077 && "${ray_python[@]}" - "$RUNTIME_ENV" "${secrets[@]}" >"$private/runtime_env.yaml") <<'PY'
import os, sys, yaml
env = yaml.safe_load(open(sys.argv[1])) or {}
env.setdefault("env_vars", {}).update({name: os.environ[name] for name in sys.argv[2:]})  # values never on argv
yaml.safe_dump(env, sys.stdout)
PY
    runtime_env=$private/runtime_env.yaml
  fi
fi

# ${a[@]+"${a[@]}"}: an empty array under set -u on macOS's bash 3.2 too.
run "$RAY" job submit --address "$address" ${no_wait[@]+"${no_wait[@]}"} --working-dir . \
  --runtime-env "$runtime_env" -- evora ${overrides[@]+"${overrides[@]}"}
