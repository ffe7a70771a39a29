#!/usr/bin/env python3
"""test_docs_code: where a doc states a table the code has, the two agree. Fails naming each difference.

- the statuses in docs/reading.md's "statuses" item = status_names in src/diagnose/verdict.c
- the exit codes in README's "Exit status" table = the codes a report may hold (src/report/report_load.c)
- the modes in README's "Gather modes" table = --mode's values in src/cli/options.c (less "all")
- `report --format`'s values in README's "Commands" = --format's values in src/cli/options.c
- every option on a `gradcheck-dist run|check|report` line of README.md and docs/*.md is in src/cli/options.c's
  table (a doc never shows a flag the program refuses)

usage: test_docs_code.py SOURCE_DIR
"""
import glob
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."


def read(path):
    with open(f"{root}/{path}", encoding="utf-8") as f:
        return f.read()


def section(text, heading):
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        sys.exit(f"test_docs_code: no '## {heading}' section")
    return m.group(1)


def option_values(options_c, flag):
    m = re.search(rf'\{{ OPT_\w+, "{re.escape(flag)}", [^,]+, "[^"]*", "([^"]*)"', options_c)
    if not m:
        sys.exit(f"test_docs_code: {flag} not in src/cli/options.c's table")
    return set(m.group(1).split(","))


failures = []


def same(what, doc, code, doc_name, code_name):
    if doc != code:
        failures.append(f"{what}: {doc_name} has {sorted(doc - code)} that {code_name} has not; "
                        f"{code_name} has {sorted(code - doc)} that {doc_name} has not")


readme, options_c = read("README.md"), read("src/cli/options.c")

verdict_c = read("src/diagnose/verdict.c")
names = set(re.findall(r'\[GCD_ST_\w+\] = "(\w+)"', verdict_c))
item = re.search(r"^- \*\*statuses\*\*:(.*?)(?=^- |\Z)", read("docs/reading.md"), re.S | re.M)
doc_statuses = set(re.findall(r"`(\w+)`(?= \(|,)", item.group(1))) if item else set()
same("statuses", doc_statuses, names, "docs/reading.md", "src/diagnose/verdict.c")

codes_doc = set(int(c) for c in re.findall(r"^\| (\d) \|", section(readme, "Exit status"), re.M))
m = re.search(r'whole\(w, doc, "", "exit_code", (\d+), (\d+), 0\)', read("src/report/report_load.c"))
codes_code = set(range(int(m.group(1)), int(m.group(2)) + 1)) if m else set()
same("exit codes", codes_doc, codes_code, "README.md", "src/report/report_load.c")

modes_doc = set(re.findall(r"^\| `(\w+)` \|", section(readme, "Gather modes"), re.M))
same("gather modes", modes_doc, option_values(options_c, "--mode") - {"all"}, "README.md", "src/cli/options.c")

fmt = re.search(r"report FILE\|- \[--format ([\w|]+)\]", section(readme, "Commands"))
same("report --format", set(fmt.group(1).split("|")) if fmt else set(), option_values(options_c, "--format"), "README.md", "src/cli/options.c")

flags = set(re.findall(r'\{ OPT_\w+, "(--[a-z][a-z0-9-]*)"', options_c)) | {"--version"}
shown = {}
for doc in ["README.md"] + sorted(p[len(root) + 1:] for p in glob.glob(f"{root}/docs/*.md")):
    for n, line in enumerate(read(doc).split("\n"), 1):
        for cmd in re.finditer(r"gradcheck-dist (?:run|check|report)\b([^`\n|]*)", line):
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", cmd.group(1)):
                shown.setdefault(flag, []).append(f"{doc}:{n}")
if len(shown) < 5:
    failures.append(f"options: only {sorted(shown)} found on the docs' command lines; the pattern no longer reads them")
unknown = {f: w for f, w in shown.items() if f not in flags}
if unknown:
    failures.append(f"options: the docs show {unknown} that src/cli/options.c has not")

checks = 5
for f in failures:
    print(f"FAIL {f}")
print(f"{checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
