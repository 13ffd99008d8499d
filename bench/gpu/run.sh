#!/usr/bin/env bash
# The one-call GPU benchmark. Runs ON the GPU machine (bare Ubuntu 24.04, 16 cores, no internet),
# from the folder bench/gpu/package.sh fills (dist/: tessera, run.sh, debs/):
#   device tool: carry ["dist"], command "bash dist/run.sh"
# Stages (each timed; a stage is skipped when the time left is below what it needs):
#   Vulkan loader from debs/, `tessera devices`, `tessera bench --roofline`,
#   for GLM-4.7-Flash q4_0, DeepSeek-V2-Lite q4_0, GLM-4.7-Flash q4_k_m (full size): synth ->
#   convert with each --compose word (GLM_COMPOSES "qk all none", LITE_COMPOSES "none all",
#   GLM_KM_COMPOSES "qk all") -> verify the first (bytes level; q4_0 files) -> on each file
#   `tessera bench -p 512 -n 128 -d 0,8192 -r 3 --profile` (SVG of the first one's profile), and on
#   the first file `tessera bench -p 0 -n 8 -r 2 --timeline` (the device-clock timeline per depth;
#   TIMELINE=0 skips it).
# Results in $OUT: summary.md, log.txt and results.tar.gz (each bench's JSON and profile SVG: the
# device tool brings back few files); a short summary table is printed last.
# Environment: OUT (results folder, default /tmp/tessera-out), WORK (models, default /tmp/tessera-work,
# never under $OUT), BUDGET_S (seconds for everything, default 530), DEPTHS (default 0,8192),
# PROMPT (default 512), GEN (default 128), REPS (default 3),
# PRESET / PRESET_LITE (default glm47flash / ds2lite), SKIP_VERIFY (set: no verify stage), TIMELINE
# (0: no timeline stage).
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
T="$HERE/tessera"
OUT="${OUT:-/tmp/tessera-out}"
WORK="${WORK:-/tmp/tessera-work}"
BUDGET_S="${BUDGET_S:-530}"
DEPTHS="${DEPTHS:-0,8192}"
PROMPT="${PROMPT:-512}"
GEN="${GEN:-128}"
REPS="${REPS:-3}"
PRESET="${PRESET:-glm47flash}"          # a small preset (tiny, tiny-lite) tries the script on lavapipe
PRESET_LITE="${PRESET_LITE:-ds2lite}"
THREADS="$(nproc)"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
mkdir -p "$OUT" "$WORK"
SUMMARY="$OUT/summary.md"   # file 1: everything readable
RESULTS="$WORK/results"     # JSON and SVG files, packed into $OUT/results.tar.gz at the end
mkdir -p "$RESULTS"
LOG="$OUT/log.txt"          # file 2: stderr of every stage
SHORT="$WORK/short.md"      # the table printed last (also appended to summary.md)
: >"$SUMMARY"
: >"$LOG"
printf '| model | compose | dispatches / barriers | test | depth | tok/s (median) | ms/token |\n|---|---|---|---|---:|---:|---:|\n' >"$SHORT"
STAGES="$WORK/stages.md"
printf '| stage | seconds | result |\n|---|---:|---|\n' >"$STAGES"

left() { echo $((DEADLINE - $(date +%s))); }
note() { echo "== $*" | tee -a "$SUMMARY"; }

# stage NAME NEED_S CMD...: runs CMD (stdout appended to summary.md or $STAGE_STDOUT, stderr to log.txt) when at
# least NEED_S seconds are left, killed at the deadline; records its time. Returns CMD's status.
stage() {
  local name="$1" need="$2"
  shift 2
  local l
  l=$(left)
  if ((l < need)); then
    echo "| $name | 0 | skipped: $l s left, needs ~$need s |" >>"$STAGES"
    echo "== $name: skipped ($l s left, needs ~$need s)" | tee -a "$SUMMARY"
    return 99
  fi
  echo "== $name" | tee -a "$SUMMARY"
  echo "== $name" >>"$LOG"
  local t0=$(date +%s) rc
  timeout --kill-after=10 "$l" "$@" >>"${STAGE_STDOUT:-$SUMMARY}" 2>>"$LOG"
  rc=$?
  local dt=$(($(date +%s) - t0))
  local what="ok"
  ((rc == 124 || rc == 137)) && what="killed at the deadline"
  ((rc != 0 && rc != 124 && rc != 137)) && what="failed (exit $rc)"
  echo "| $name | $dt | $what |" >>"$STAGES"
  echo "   $name: $what in ${dt} s" | tee -a "$SUMMARY"
  ((rc != 0)) && tail -n 5 "$LOG" | sed 's/^/   log: /'
  return $rc
}

free_gb() { df --output=avail -B1G "$WORK" | tail -n 1 | tr -d ' '; }

# Rows "| tgN | depth | ... | median | ms |" of a bench markdown output -> the short table.
shorten() {
  local model="$1" compose="$2" md="$3"
  local per_token
  per_token=$(grep -m1 '^per token:' "$md" | sed -E 's/^per token: *([0-9]+) dispatches, ([0-9]+) barriers.*/\1 \/ \2/')
  awk -F'|' -v m="$model" -v c="$compose" -v d="${per_token:-?}" '
    $2 ~ /^ (pp|tg)[0-9]+ $/ { gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $6); gsub(/ /, "", $7);
                               printf "| %s | %s | %s | %s | %s | %s | %s |\n", m, c, d, $2, $3, $6, $7 }' "$md" >>"$SHORT"
}

# bench_model NAME COMPOSE TSR [extra bench args]: bench into $WORK/NAME.md and $OUT/NAME.json.
bench_model() {
  local name="$1" compose="$2" tsr="$3"
  shift 3
  : >"$WORK/$name.md"
  STAGE_STDOUT="$WORK/$name.md" stage "bench $name" 40 "$T" bench "$tsr" -p "$PROMPT" -n "$GEN" -d "$DEPTHS" \
    -r "$REPS" --json "$RESULTS/$name.json" "$@"
  local rc=$?
  cat "$WORK/$name.md" >>"$SUMMARY"
  shorten "${name%-*}" "$compose" "$WORK/$name.md"
  return $rc
}

# --- 1. Vulkan loader and driver ------------------------------------------------------------
note "tessera GPU benchmark, $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET_S} s, $THREADS threads"
t0=$(date +%s)
# shellcheck source=bench/gpu/vulkan_env.sh
. "$HERE/vulkan_env.sh"
vulkan_env "$HERE" "$T" "$LOG" | tee -a "$SUMMARY"
echo "| vulkan setup | $(($(date +%s) - t0)) | ok |" >>"$STAGES"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | sed 's/^/nvidia-smi: /' | tee -a "$SUMMARY"

stage "devices" 5 "$T" devices || { note "no usable Vulkan device: stopping"; cat "$STAGES"; exit 3; }
stage "roofline" 20 "$T" bench --roofline

# --- 2. the grid: GLM-4.7-Flash q4_0 and q4_k_m, DeepSeek-V2-Lite q4_0, each in several MLA compositions
# model PRESET TYPE NAME VERIFY COMPOSES: synth -> for each --compose word: convert -> bench
# (+profile) -> remove; the first word's file is also verified (VERIFY=1), drawn (profile SVG) and
# timed in the timeline; the GGUF is removed last (disk: the GGUF and one .tsr at a time).
model() {
  local preset="$1" type="$2" name="$3" verify="$4" composes="$5"
  local gguf="$WORK/$name.gguf" first=1 c tsr
  note "disk free in $WORK: $(free_gb) GB"
  if stage "synth $preset $type" 60 "$T" --threads "$THREADS" synth --preset "$preset" --type "$type" -o "$gguf"; then
    for c in $composes; do
      tsr="$WORK/$name-$c.tsr"
      stage "convert $name --compose $c" 40 "$T" convert "$gguf" -o "$tsr" --compose "$c" --threads "$THREADS"
      if [ -e "$tsr" ] && [ "$first" = 1 ]; then
        [ "$verify" = 1 ] && [ -z "${SKIP_VERIFY:-}" ] && stage "verify $name $c" 90 "$T" verify "$gguf" "$tsr" --threads "$THREADS"
        bench_model "$name-$c" "$c" "$tsr" --profile --profile-out "$RESULTS/$name-$c-profile.svg"
        if [ "${TIMELINE:-1}" != 0 ]; then
          : >"$WORK/$name-timeline.md"
          STAGE_STDOUT="$WORK/$name-timeline.md" stage "timeline $name-$c" 30 "$T" bench "$tsr" -p 0 -n 8 -d "$DEPTHS" -r 2 \
            --timeline --json "$RESULTS/$name-$c-timeline.json"
          sed -n '/^device-clock timeline/,$p' "$WORK/$name-timeline.md" >>"$SUMMARY"
        fi
      elif [ -e "$tsr" ]; then
        bench_model "$name-$c" "$c" "$tsr" --profile
      fi
      rm -f "$tsr"
      first=0
    done
  fi
  rm -f "$gguf"
}
model "$PRESET" q4_0 glm-q4_0 1 "${GLM_COMPOSES:-qk all none}"
model "$PRESET_LITE" q4_0 ds2lite-q4_0 1 "${LITE_COMPOSES:-none all}"
model "$PRESET" q4_k_m glm-q4_k_m 0 "${GLM_KM_COMPOSES:-qk all}"

# --- 4. summary ----------------------------------------------------------------------------
{
  echo
  echo "## stage times"
  cat "$STAGES"
  echo
  echo "## decode / prefill (median tok/s)"
  cat "$SHORT"
} >>"$SUMMARY"
echo
echo "## stage times (total $(($(date +%s) - START)) s of ${BUDGET_S} s)"
cat "$STAGES"
tar -czf "$OUT/results.tar.gz" -C "$RESULTS" . 2>>"$LOG"
echo
echo "files in $OUT: $(ls "$OUT" | tr '\n' ' ') (results.tar.gz: $(ls "$RESULTS" | tr '\n' ' '))"
echo
echo "## summary (median tok/s)"
cat "$SHORT"
rm -rf "$WORK"
