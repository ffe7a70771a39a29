"""Runs docs/python.md's recipes as written (issue 38: the recipes in docs/, tests that run them as written).

run_section(HEADING, namespace) takes the ```python blocks of the section `## HEADING...` and runs them in order,
in a copy of `namespace` (the test module's helpers the text names but does not define: make_mlp, mlp_batch, ...):
definitions as written; each line that calls check_ddp( is a call whose trailing comment says what it gives:
no comment or `# passes` (returns), `# GradcheckFailure: WORDS` (raises GradcheckFailure, WORDS in its message).
The doc's own functions are not importable by name, so check_ddp forks its ranks: they run the doc's text, never
a test's namesake. Returns [(line, what the call returned or raised)].
"""
import os
import re

import pytest

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "python.md")


def blocks(heading, doc=DOC):
    with open(doc) as f:
        text = f.read()
    m = re.search(r"^## " + re.escape(heading) + r".*?\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{doc} has no section '## {heading}'"
    found = re.findall(r"^```python\n(.*?)^```", m.group(1), re.S | re.M)
    assert found, f"'## {heading}' has no python block"
    return found


def run_section(heading, namespace):
    from gradcheck_dist import GradcheckFailure, check_ddp

    ns = dict(namespace, __name__="docs_python_md")   # not importable: the ranks are forked, with the doc's text
    ns.setdefault("check_ddp", check_ddp)   # the doc's blocks assume `from gradcheck_dist import check_ddp`
    out, pending = [], []
    for block in blocks(heading):
        for line in block.splitlines() + [""]:
            if not line.startswith("check_ddp("):
                pending.append(line)
                continue
            exec(compile("\n".join(pending), DOC, "exec"), ns)
            pending = []
            call, _, comment = line.partition("#")
            want = comment.strip()
            assert want in ("", "passes") or want.startswith("GradcheckFailure"), line
            if want.startswith("GradcheckFailure"):
                with pytest.raises(GradcheckFailure) as e:
                    eval(call, ns)
                words = want.partition(":")[2].strip()
                assert words in str(e.value), (line, str(e.value)[-2000:])
                out.append((line, e.value))
            else:
                out.append((line, eval(call, ns)))
        exec(compile("\n".join(pending), DOC, "exec"), ns)
        pending = []
    assert out, f"'## {heading}' calls check_ddp nowhere"
    return out
