#!/usr/bin/env bash
# A/B decode measurement on the GPU machine (one device call, ~5 min): full-size GLM-4.7-Flash
# q4_0, composed and factored, each with the int8-activation kernels and with --f32-activations,
# decode tg128 at depth 0 (+ DEPTH2, default 4096, on the composed file) with --profile.
#   device tool: carry ["dist"], command "bash dist/ab.sh"
# Environment: OUT (results, default /tmp/tessera-out), WORK (models, default /tmp/tessera-work),
# PRESET (default glm47flash), TYPE (default q4_0), DEPTH2 (default 4096; empty: none),
# ATTN_VARIANTS (set: decode tg128 at depth 0 and 4096 per `--attention` variant, "default" = none),
# COMPOSE (default "all none"; a word "all:q4_0" also converts with --composed-type q4_0, into
# m-all-q4_0.tsr), ONLY_PREFILL (set: only `bench -p 512 -n 128 -d 0 -r 2 --profile` per file),
# BENCH_VARIANTS (set: extra bench arguments per variant, separated by ';', "default" = none: decode
# tg128 at depths DEPTHS (default 0,4096) with --profile on the composed file, e.g.
# "default;--tune matvec_rows=1"; VARIANT_COMPOSE=none runs them on the factored file, which
# COMPOSE must then make; a variant beginning "@NAME " runs on m-NAME.tsr, e.g. "@all-q4_0 default";
# REPS: timed runs per BENCH_VARIANTS variant, default 2); PREFILL_VARIANTS (the same for prefill:
# pp512 at DEPTHS with --profile, e.g. "default;--tune prefill_matmul=0");
# ROOFLINE (set: `tessera bench --roofline` first, into roofline.md).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
T="$HERE/tessera"
OUT="${OUT:-/tmp/tessera-out}"
WORK="${WORK:-/tmp/tessera-work}"
PRESET="${PRESET:-glm47flash}"
TYPE="${TYPE:-q4_0}"
DEPTH2="${DEPTH2-4096}"
mkdir -p "$OUT" "$WORK"
LOG="$OUT/ab-log.txt"
: >"$LOG"
. "$HERE/vulkan_env.sh"
vulkan_env "$HERE" "$T" "$LOG"
"$T" devices 2>>"$LOG" | head -20
if [ -n "${ROOFLINE:-}" ]; then  # the device's read bandwidth and dispatch / barrier costs first
  "$T" bench --roofline >"$OUT/roofline.md" 2>>"$LOG"
  grep -E "^\| (read|dispatch|the same|empty|indirect|dependent|grid)" "$OUT/roofline.md"
fi
G="$WORK/m.gguf"
/usr/bin/time -f "synth %e s" "$T" --threads "$(nproc)" synth --preset "$PRESET" --type "$TYPE" -o "$G" 2>>"$LOG" >/dev/null
COMPOSE="${COMPOSE:-all none}"
for c in $COMPOSE; do
  kind="${c%%:*}"
  ctype=()
  [ "$kind" != "$c" ] && ctype=(--composed-type "${c#*:}")
  /usr/bin/time -f "convert $c %e s" "$T" convert "$G" -o "$WORK/m-${c/:/-}.tsr" --compose "$kind" "${ctype[@]}" --threads "$(nproc)" >/dev/null 2>>"$LOG"
done
rm -f "$G"
grep -E "^(synth|convert)" "$LOG"
run() {  # run NAME ARGS...: bench into $OUT/NAME.md
  local name="$1"
  shift
  echo "== $name: tessera bench $*"
  timeout 200 "$T" bench "$@" >"$OUT/$name.md" 2>>"$LOG"
  echo "   exit $?"
  grep -E "^(per token|activations|prefill|per-kernel)|^\| [a-z]" "$OUT/$name.md"
}
if [ -n "${ATTN_VARIANTS:-}" ]; then  # e.g. "default heads=4 slice=8": decode attention splits
  for v in $ATTN_VARIANTS; do
    extra=()
    [ "$v" != default ] && extra=(--attention "$v")
    run "attn-$v" "$WORK/m-all.tsr" -p 0 -n 128 -d 0,4096 -r 2 --profile "${extra[@]}"
  done
  tail -n 3 "$LOG"
  exit 0
fi
# run_variants PREFIX VARIANTS TEST_ARGS...: one bench run per ';'-separated variant (extra
# arguments, "default" = none; "@NAME rest": on m-NAME.tsr) with TEST_ARGS at DEPTHS, REPS times.
run_variants() {
  local prefix="$1" list="$2"
  shift 2
  IFS=';' read -ra variants <<<"$list"
  local i=0 v file
  for v in "${variants[@]}"; do
    file="m-${VARIANT_COMPOSE:-all}.tsr"
    if [[ "$v" == @* ]]; then  # "@NAME rest": the variant's own file
      file="m-${v%% *}.tsr"
      file="${file/@/}"
      v="${v#* }"
    fi
    extra=()
    [ "$v" != default ] && read -ra extra <<<"$v"
    run "$prefix-$i" "$WORK/$file" "$@" -d "${DEPTHS:-0,4096}" -r "${REPS:-2}" --profile "${extra[@]}"
    i=$((i + 1))
  done
  tail -n 3 "$LOG"
}
if [ -n "${BENCH_VARIANTS:-}" ]; then
  run_variants variant "$BENCH_VARIANTS" -p 0 -n 128
  exit 0
fi
if [ -n "${PREFILL_VARIANTS:-}" ]; then  # as BENCH_VARIANTS, prefill pp512 (-n 0) at DEPTHS
  run_variants prefill "$PREFILL_VARIANTS" -p 512 -n 0
  exit 0
fi
if [ -n "${ONLY_PREFILL:-}" ]; then
  for c in $COMPOSE; do run "$c-prefill" "$WORK/m-$c.tsr" -p 512 -n 128 -d 0 -r 2 --profile; done
  tail -n 5 "$LOG"
  exit 0
fi
for c in $COMPOSE; do
  run "$c-int8" "$WORK/m-$c.tsr" -p 0 -n 128 -d 0 -r 3 --profile
  run "$c-f32" "$WORK/m-$c.tsr" -p 0 -n 128 -d 0 -r 3 --profile --f32-activations
done
[ -n "$DEPTH2" ] && run "all-int8-d$DEPTH2" "$WORK/m-all.tsr" -p 0 -n 128 -d "$DEPTH2" -r 3 --profile
tail -n 5 "$LOG"
