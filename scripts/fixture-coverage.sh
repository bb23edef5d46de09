#!/usr/bin/env bash
# Which recordings reach analysis code that the others do not: replays every trace under the
# given folders with a coverage-instrumented linger, then picks, after the recordings always
# kept, the fewest others that together reach every code region any of them reaches.
# How the suite's fixtures were chosen (scripts/h200/suite/README.md); run it over a new pass
# and the committed fixtures before committing the new pass.
#
# usage: [KEEP='suite/pass15/ suite/lean6/'] bash scripts/fixture-coverage.sh [DIR...]
#        (DIR defaults to tests/data/h200; KEEP lists path prefixes, relative to DIR, kept whole)
# needs: rustup's llvm-tools (`rustup component add llvm-tools`), the eBPF toolchain (cargo xtask setup)
set -eu
cd "$(dirname "$0")/.."
DIRS=${*:-tests/data/h200}
KEEP=${KEEP:-suite/pass15/ suite/lean6/ suite/xid/ campaign/ agent/ agent-flight/ storms/}
OUT=target/coverage/replays
TOOLS=$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin
BIN=target/coverage/release/linger
# xtask setup puts bpf-linker under ~/.cache/linger/<the pinned nightly>/ (tracer-user/ebpf-toolchain.rs).
NIGHTLY=$(sed -n 's/.*"\(nightly-[0-9-]*\)".*/\1/p' tracer-user/ebpf-toolchain.rs)
cargo run -q -p xtask -- setup
PATH=${LINGER_TOOLCHAIN_DIR:-$HOME/.cache/linger}/$NIGHTLY/bpf-linker/bin:$PATH \
  CARGO_TARGET_DIR=target/coverage LLVM_PROFILE_FILE=/dev/null \
  CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C instrument-coverage" \
  cargo build -q --release -p tracer-user --bin linger
mkdir -p "$OUT"
for dir in $DIRS; do
  find "$dir" -name '*.trace' | sort | while read -r t; do
    id=$(echo "${t#"$dir"/}" | tr '/' '~')
    LLVM_PROFILE_FILE="$OUT/$id.profraw" "$BIN" replay --json --events "$t" >/dev/null 2>&1 || true
    "$TOOLS/llvm-profdata" merge -sparse "$OUT/$id.profraw" -o "$OUT/$id.profdata"
    # Code regions entered at least once, as file:line:column.
    "$TOOLS/llvm-cov" export -format=text -skip-functions -instr-profile "$OUT/$id.profdata" \
      "$BIN" tracer-user/src | python3 -c '
import json, sys
for f in json.load(sys.stdin)["data"][0]["files"]:
    for line, col, count, has_count, entry, gap in f["segments"]:
        if count and has_count and entry and not gap:
            print(f"{f['"'"'filename'"'"']}:{line}:{col}")' > "$OUT/$id.regions"
    rm -f "$OUT/$id.profraw" "$OUT/$id.profdata"
  done
done
KEEP="$KEEP" python3 - "$OUT" <<'PY'
import os, sys
out = sys.argv[1]
keep = os.environ["KEEP"].split()
reached = {f[:-len(".regions")].replace("~", "/"): set(open(os.path.join(out, f)).read().split())
           for f in os.listdir(out) if f.endswith(".regions")}
kept = [t for t in reached if any(t.startswith(k) for k in keep)]
have = set().union(*(reached[t] for t in kept)) if kept else set()
every = set().union(*reached.values())
print(f"{len(reached)} recordings reach {len(every)} code regions; the {len(kept)} always kept reach {len(have)}")
rest = {t: r for t, r in reached.items() if t not in kept}
while rest:
    t, gain = max(((t, len(r - have)) for t, r in rest.items()), key=lambda x: (x[1], -len(x[0])))
    if not gain:
        break
    files = sorted({r.rsplit(":", 2)[0].split("tracer-user/src/")[-1] for r in rest[t] - have})
    print(f"keep {t}: {gain} more regions ({', '.join(files)})")
    have |= rest.pop(t)
print(f"every other recording reaches nothing more ({len(rest)})")
PY
