#!/usr/bin/env bash
# The report's values end to end: one setup per probe (schema /2), a tensor of 4097 elements elided and
# one of 4096 written whole unless --full, every report valid against reports/schema.json and checked by
# check_report.py (with --full, every reference against numpy central differences), and a report as
# schema /1 wrote it (a setup in every run) rendered as text, Markdown and JUnit exactly as the /2 one.
# usage: test_report_values.sh GRADCHECK_DIST SOURCE_DIR PYTHON
set -u
G=$1 SRC=$2 PY=${3:-/usr/bin/python3}
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# img.weight (16, 256): 4096 elements; x_txt (17, 241): 4097; x_img (17, 256) and txt.weight (16, 241) beside them
# (--mode on: one run a probe keeps the schema validation short; test_report.c has a probe under several modes)
sizes=(--world 2 --mode on --batch 17 --dim-img 256 --dim-txt 241 --dim-emb 16)
"$G" run "${sizes[@]}" --json lim.json >lim.txt 2>&1 || fail "run: exit $?: $(cat lim.txt)"
"$G" run "${sizes[@]}" --full --json full.json >full.txt 2>full.err || fail "run --full: exit $?: $(cat full.txt full.err)"
out=$("$G" run "${sizes[@]}" --full --summary-only --json x.json 2>&1) && rc=0 || rc=$?
[ $rc = 2 ] && grep -q -- --full <<<"$out" || fail "--full --summary-only must exit 2 naming --full: exit $rc, $out"
for f in lim full; do
    "$PY" "$SRC/tests/check_report.py" "$SRC/reports/schema.json" $f.json $f.txt || fail "check_report.py on $f.json"
done

"$PY" - lim.json full.json <<'PY' || fail "setups and elision"
import json, sys
lim, full = (json.load(open(f)) for f in sys.argv[1:3])
for d in (lim, full):
    assert d["schema"] == "gradcheck-dist.report/3", d["schema"]
    assert [s["probe"] for s in d["setups"]] == ["simplenet", "contrastive", "tp"], d["setups"]
    assert len(d["runs"]) == 3 and not any("setup" in r for r in d["runs"]), "a run holds its setup"
def tensors(d):
    s = d["setups"][1]
    t = {p["name"]: p["init"] for p in s["params"]}
    t.update({f"{x['name']}[{r['rank']}]": x["data"] for r in s["inputs"] for x in r["tensors"]})
    t.update({f"{p['name']}.{k}": p[k] for p in d["runs"][1]["params"] for k in ("reduced", "reference")})
    return t
a, b = tensors(lim), tensors(full)
assert lim["values"]["limit"] == 4096 and not lim["values"]["full"] and full["values"]["full"], (lim["values"], full["values"])
assert isinstance(a["img.weight"], list) and len(a["img.weight"]) == 4096, "4096 elements must be written whole"
assert a["img.weight"] == b["img.weight"]
for name in ("x_txt[1]", "x_img[0]", "x_txt[0]"):
    e = a[name]
    assert e["elided"] is True and e["numel"] == len(b[name]) > 4096 and e["first"] == b[name][:16], (name, e)
    assert abs(e["norm"] - sum(v * v for v in b[name]) ** 0.5) <= 1e-13 * e["norm"], (name, e["norm"])
assert isinstance(a["img.weight.reduced"], list) and isinstance(a["txt.weight"], list), "under the limit: whole"
print(f"report sizes: {len(open(sys.argv[1]).read())} bytes elided, {len(open(sys.argv[2]).read())} with --full")
PY

# the schema refuses a /2 report with a setup in a run, and an elided tensor that is not one
"$PY" - "$SRC/reports/schema.json" lim.json <<'PY' || fail "the schema accepted a broken report"
import copy, json, sys
import jsonschema
schema, d = (json.load(open(f)) for f in sys.argv[1:3])
for p in d["runs"][1]["params"]:   # fewer numbers to validate: the cases are in the setups
    p.update(local=[None, None], reduced=None, reference=None)
jsonschema.validate(d, schema)
broken = []
x = copy.deepcopy(d); x["runs"][1]["setup"] = x["setups"][1]; broken.append(("setup in a /2 run", x))
x = copy.deepcopy(d); x["setups"][1]["inputs"][0]["tensors"][1]["data"]["elided"] = False; broken.append(("elided false", x))
x = copy.deepcopy(d); x["setups"][1]["inputs"][0]["tensors"][1]["data"]["first"] += [0.0]; broken.append(("17 first values", x))
for what, x in broken:
    try:
        jsonschema.validate(x, schema)
        sys.exit(f"the schema accepted: {what}")
    except jsonschema.ValidationError:
        pass
PY

# schema /1: the setup in every run, no setups, no values; read and rendered as the /2 report is
"$PY" - full.json old.json <<'PY' || fail "could not write the /1 report"
import json, sys
d = json.load(open(sys.argv[1]))
setups = {s.pop("probe"): s for s in d.pop("setups")}
d.pop("values")
d["schema"] = "gradcheck-dist.report/1"
for r in d["runs"]:
    r["setup"] = setups[r["probe"]]
json.dump(d, open(sys.argv[2], "w"))
PY
"$PY" "$SRC/tests/check_report.py" "$SRC/reports/schema.json" old.json || fail "check_report.py on the /1 report"
for fmt in text md junit; do
    "$G" report full.json --format $fmt >new.$fmt || fail "report full.json --format $fmt: exit $?"
    "$G" report old.json --format $fmt >old.$fmt || fail "report old.json (schema /1) --format $fmt: exit $?"
    [ -s new.$fmt ] || fail "report --format $fmt: empty"
done
diff new.text old.text >/dev/null && diff new.junit old.junit >/dev/null || fail "/1 and /2 render differently: $(diff new.text old.text | head -5)"
diff <(sed '/<details>/,$d' new.md) <(sed '/<details>/,$d' old.md) >/dev/null || fail "/1 and /2 render different Markdown"
diff <(grep -v '^report: ' full.txt) new.text >/dev/null || fail "report full.json differs from what run printed"

echo "test_report_values: $fails failure(s)"
[ $fails = 0 ]
