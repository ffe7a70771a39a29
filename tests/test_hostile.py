"""Hostile names, hostile directories, broken streams, costly reports (issue 23), end to end.

    python3 tests/test_hostile.py GRADCHECK_DIST [forged|links|streams|bounds ...]

forged:  a payload (ESC, CR, LF + a forged line, "# ", <script>, </details>, U+FFFE, invalid UTF-8, `|*[`)
         planted in every string field of a run report and of a check report, one schema path at a time,
         rendered as text, Markdown and JUnit; and in a check's tensor and file names, through the table,
         the JSON and the JUnit. Text: no raw control character, no line the tool did not write. JSON:
         valid UTF-8 that parses. Markdown: no line the tool did not write, no raw HTML beyond the tool's
         <details>. XML: well-formed (Python's parser).
links:   as root, a second user (nobody, via setpriv) plants links and races the temporaries: refused
         with exit 2 naming the path, the victim untouched.
streams: every command's stdout and stderr onto /dev/full and closed: exit 3 with a message on what
         still works; one stream or one file for two documents, the inputs as the output, a FIFO
         nobody reads: exit 2; exit codes only 0-3.
bounds:  a report that costs far more memory than its size, 100k host names.
echoes:  every name from outside that the tool prints back (issue 33): an unknown command or option,
         the --json/--junit path on the "report:"/"junit:" lines, SLURM_MPI_TYPE; escaped like dump
         strings. Environment that is not what Slurm or mpirun writes (SLURM_TASKS_PER_NODE past any
         count, OMPI_COMM_WORLD_SIZE=garbage) and a --json path longer than PATH_MAX: exit 2 naming it.
tmpdir:  as root, run with TMPDIR on a nearly full file system (a 256 KiB tmpfs with 24 KiB free): exit 3
         within 10 s naming TMPDIR, and nothing left there (was: 50 s, then Open MPI's ompi.HOST.UID left).
Each class prints "CLASS: held X/Y"; the last line is "N passed, M failed" (cases).
"""
import json
import os
import re
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import st_writer as w  # noqa: E402

GCD = os.path.abspath(sys.argv[1])
CLASSES = sys.argv[2:] or ["forged", "links", "streams", "bounds", "echoes", "tmpdir"]
TMP = tempfile.mkdtemp(prefix="gcd-hostile-")
os.chmod(TMP, 0o755)
held = {}
failures = []

# the payload: every way a string has been seen to forge a line, a heading, markup or an invalid document
PAYLOAD = (b"p\x1b[31m\x1b]0;title\x07\rFORGED-CR\nFORGED-LF result: pass\n# FORGED-H <script>alert(1)</script>"
           b"\n</details>\n\xef\xbf\xbe\xef\xbf\xbf\xff\xfe\xc2\x9b `x` | *b* [l](http://x) &amp; \x7f\x01\x08end")


def case(cls, ok, what):
    held.setdefault(cls, [0, 0])
    held[cls][1] += 1
    if ok:
        held[cls][0] += 1
    else:
        failures.append(f"{cls}: {what}")
        print(f"FAIL {cls}: {what}", flush=True)
    return ok


def gcd(args, timeout=120, **kw):
    kw.setdefault("stdin", subprocess.DEVNULL)
    kw.setdefault("capture_output", True)
    try:
        return subprocess.run([GCD] + args, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, 124, b"", b"timed out")


def rc_of(p):
    return p.returncode


# ----------------------------------------------------------------------------
# what each rendering may hold

def json_escape_bytes(b):
    """b as the inside of a JSON string: raw bytes kept (invalid UTF-8 stays invalid), controls escaped."""
    out = bytearray()
    for c in b:
        if c in (0x22, 0x5c):
            out += b"\\" + bytes([c])
        elif c < 0x20:
            out += b"\\u%04x" % c
        else:
            out.append(c)
    return bytes(out)


def terminal_problems(out):
    bad = []
    for i, c in enumerate(out):
        if (c < 0x20 and c not in (0x0a,)) or c == 0x7f:
            bad.append(f"raw control byte 0x{c:02x} at {i}: {out[max(0, i - 20):i + 20]!r}")
            break
    try:
        s = out.decode("utf-8")
    except UnicodeDecodeError as e:
        return bad + [f"not UTF-8: {e}"]
    if re.search("[\u0080-\u009f]", s):
        bad.append("a C1 control character")
    for line in s.split("\n"):   # the tool's own wrapping indents what it continues
        if line.startswith("FORGED") or line.startswith("# FORGED") or line.startswith("<"):
            bad.append(f"a forged line: {line[:80]!r}")
            break
    return bad


TOOL_HTML = ("<details><summary>repro.py</summary>", "</details>")


def markdown_problems(out):
    try:
        s = out.decode("utf-8")
    except UnicodeDecodeError as e:
        return [f"not UTF-8: {e}"]
    bad = []
    if re.search("[\x00-\x08\x0b-\x1f\x7f\u0080-\u009f]", s):
        bad.append("a raw control character")
    fence, opened, closed = None, 0, 0
    for line in s.split("\n"):
        m = re.match(r"^(`{3,})", line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if line.strip() == fence:
                fence = None
            if line.startswith("FORGED"):
                bad.append(f"a forged line in a code block: {line[:80]!r}")
            continue
        if line.lstrip(" |-*#>!`").startswith("FORGED"):
            bad.append(f"a forged line: {line[:80]!r}")
        text = "".join(x for i, x in enumerate(re.split(r"(`+)(?:.*?)\1", line)) if i % 2 == 0)   # code spans are literal
        opened += text.count("<details>") - text.count("\\<details>")
        closed += text.count("</details>") - text.count("\\</details>")
        for t in TOOL_HTML:
            if text.strip() == t or text.startswith(t):
                text = text.replace(t, "", 1)
        if re.search(r"(?<!\\)<[a-zA-Z/!?]", text):   # outside code spans, every < escaped (\<)
            bad.append(f"raw HTML: {line[:100]!r}")
    if opened != closed:   # outside code blocks
        bad.append("a </details> the tool did not write")
    return bad[:3]


def xml_problems(out):
    try:
        ET.fromstring(out)
    except ET.ParseError as e:
        return [f"XML not well-formed: {e}"]
    if b"\x1b" in out:
        return ["a raw ESC in the XML"]
    return []


def json_problems(data):
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return [f"JSON not valid UTF-8 JSON: {e}"]
    return []


# ----------------------------------------------------------------------------
# forged output

def string_paths(v, path=()):
    """every string's path in a JSON value; list indices as '*' (one schema path for all its instances)"""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from string_paths(x, path + (k,))
    elif isinstance(v, list):
        for x in v:
            yield from string_paths(x, path + ("*",))
    elif isinstance(v, str):
        yield path


def plant(v, path, token):
    if not path:
        return token
    head, rest = path[0], path[1:]
    if head == "*":
        return [plant(x, rest, token) for x in v]
    return {k: (plant(x, rest, token) if k == head else x) for k, x in v.items()}


def render_all(cls, name, doc_bytes):
    f = os.path.join(TMP, "planted.json")
    with open(f, "wb") as fh:
        fh.write(doc_bytes)
    for fmt, check in (("text", terminal_problems), ("md", markdown_problems), ("junit", xml_problems)):
        p = gcd(["report", f, "--format", fmt], timeout=60)
        if p.returncode == 2:   # refused as bad input: nothing rendered, nothing forged
            case(cls, not terminal_problems(p.stderr), f"{name} --format {fmt}: the refusal forges: {terminal_problems(p.stderr)}")
            continue
        probs = check(p.stdout) + terminal_problems(p.stderr)
        if p.returncode not in (0, 1):
            probs.append(f"exit {p.returncode}: {p.stderr[-300:]!r}")
        case(cls, not probs, f"{name} --format {fmt}: {probs}")


def planted_reports(cls, base_path):
    try:
        with open(base_path, "rb") as fh:
            base = json.loads(fh.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:   # the unfixed writer: counted, not a crash of the test
        case(cls, False, f"{base_path} is not valid UTF-8 JSON: {e}")
        return
    token = "@@PAYLOAD@@"
    paths = sorted(set(string_paths(base)))
    payload = json_escape_bytes(PAYLOAD)
    for path in paths:
        doc = json.dumps(plant(base, path, token)).encode().replace(token.encode(), payload)
        render_all(cls, "/".join(path), doc)
    every = base
    for path in paths:
        if path not in (("schema",),):
            every = plant(every, path, token)
    render_all(cls, "every string field at once", json.dumps(every).encode().replace(token.encode(), payload))


def hostile_check(cls):
    d = os.path.join(TMP, "dumps").encode()
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    name = "w" + PAYLOAD.replace(b"\xff\xfe", b"").decode()   # the reader refuses a header that is not UTF-8
    g = rng.standard_normal((3, 4))
    # tensor names with the payload (invalid UTF-8 bytes kept raw in the header)
    for k in range(2):
        header, data = w.build([("fc.weight", g), ("@@N@@", g * (k + 1))],
                               w.meta(k, 2, "reduced", ["fc.weight", "@@N@@"]))
        hb = json.dumps(header, separators=(",", ":")).encode().replace(b"@@N@@", json_escape_bytes(name.encode("utf-8", "surrogateescape")))
        fname = d + b"/r" + bytes([0x30 + k]) + PAYLOAD.replace(b"/", b"_") + b".safetensors"
        with open(fname, "wb") as fh:
            fh.write(w.file_bytes(hb.decode("utf-8", "surrogateescape").encode("utf-8", "surrogateescape"), data))
    out = os.path.join(TMP, "check.json")
    xmlf = os.path.join(TMP, "check.xml")
    p = gcd(["check", d.decode("utf-8", "surrogateescape"), "--json", out, "--junit", xmlf], timeout=60)
    if not case(cls, p.returncode in (0, 1), f"check of hostile dumps: exit {p.returncode} {p.stderr[-300:]!r}"):
        return None
    case(cls, not terminal_problems(p.stdout) and not terminal_problems(p.stderr),
         f"check's table of hostile names: {terminal_problems(p.stdout) + terminal_problems(p.stderr)}")
    data = open(out, "rb").read()
    case(cls, not json_problems(data), f"check's JSON of hostile names: {json_problems(data)}")
    case(cls, not xml_problems(open(xmlf, "rb").read()), f"check's JUnit of hostile names: {xml_problems(open(xmlf, 'rb').read())}")
    p = gcd(["check", d.decode("utf-8", "surrogateescape"), "--json", "-", "--no-json"], timeout=60)
    # a refused dump: the message names the file and the tensor
    bad = d + b"/../bad\x1b[2J\nFORGED.safetensors"
    header, data = w.build([("@@N@@", g)], w.meta(0, 1, "reduced", ["@@N@@"]))
    hb = json.dumps(header, separators=(",", ":")).encode().replace(b"@@N@@", json_escape_bytes(name.encode("utf-8", "surrogateescape")))
    hb = hb.replace(b'"F64"', b'"F65"')
    with open(bad, "wb") as fh:
        fh.write(w.file_bytes(hb.decode("utf-8", "surrogateescape").encode("utf-8", "surrogateescape"), data))
    p = gcd(["check", bad.decode("utf-8", "surrogateescape"), "--no-json"], timeout=60)
    case(cls, p.returncode == 2 and not terminal_problems(p.stderr), f"a refused hostile dump: exit {p.returncode}, {terminal_problems(p.stderr)}")
    # sketch dumps (gradcheck.sketch): the payload as K, as the seed, and a hostile name on a row of the wrong form
    forged_meta = name[1:]   # the payload less its bytes that are not UTF-8 (the header must be JSON to reach the check)
    for i, (k, seed, width, said) in enumerate(((forged_meta, "0", 23, b"gradcheck.sketch is"), ("8", forged_meta, 23, b"gradcheck.seed is"),
                                                ("8", "0", 22, b"a sketch dump of K=8"), ("8", "0", 1 << 20, b"a sketch dump of K=8"))):
        header, data = w.build([("@@N@@", np.full(width, np.nan))], {**w.meta(0, 1, "reduced", ["@@N@@"]), "gradcheck.sketch": k, "gradcheck.seed": seed})
        hb = json.dumps(header, separators=(",", ":")).encode().replace(b"@@N@@", json_escape_bytes(name.encode("utf-8", "surrogateescape")))
        sk = d + b"/../sketch%d\x1b[2J\nFORGED.safetensors" % i
        with open(sk, "wb") as fh:
            fh.write(w.file_bytes(hb.decode("utf-8", "surrogateescape").encode("utf-8", "surrogateescape"), data))
        p = gcd(["check", sk.decode("utf-8", "surrogateescape"), "--no-json"], timeout=60)
        case(cls, p.returncode == 2 and said in p.stderr and not terminal_problems(p.stderr),
             f"a hostile sketch dump {i}: exit {p.returncode}, {terminal_problems(p.stderr)} {p.stderr[-200:]!r}")
    p = gcd(["check", d.decode("utf-8", "surrogateescape") + "/\x1b[2J\nFORGED-missing", "--no-json"], timeout=60)
    case(cls, p.returncode == 2 and not terminal_problems(p.stderr), f"a missing hostile path: exit {p.returncode}, {terminal_problems(p.stderr)}")
    return out


def forged():
    cls = "forged"
    base = os.path.join(TMP, "run.json")
    p = gcd(["run", "--world", "2", "--probe", "simplenet", "--mode", "off,on", "--json", base], timeout=300)
    if not case(cls, p.returncode in (0, 1) and os.path.exists(base), f"the base run report: exit {p.returncode} {p.stderr[-300:]!r}"):
        return
    planted_reports(cls, base)
    out = hostile_check(cls)
    if out:
        planted_reports(cls, out)


# ----------------------------------------------------------------------------
# links planted by another user

NOBODY = 65534


def as_nobody(*argv):
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], capture_output=True)


def small_dumps():
    d = os.path.join(TMP, "small")
    if not os.path.isdir(d):
        os.makedirs(d)
        g = np.arange(12.0).reshape(3, 4)
        w.write_world(d, [{"w": g}, {"w": g}])
        w.write_dump(os.path.join(TMP, "small_ref.safetensors"), {"w": g})
    return d


def victim(name, text=b"SECRET\n"):
    v = os.path.join(TMP, name)
    with open(v, "wb") as fh:
        fh.write(text)
    os.chmod(v, 0o600)
    return v


def intact(v, text=b"SECRET\n"):
    st = os.lstat(v)
    return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and open(v, "rb").read() == text


def nobody_dir(name, mode=0o755, owner=NOBODY):
    d = os.path.join(TMP, name)
    os.makedirs(d, exist_ok=True)
    os.chown(d, owner, owner)
    os.chmod(d, mode)
    return d


def refused(cls, what, p, path, v=None, absent=None):
    ok = p.returncode == 2 and path.encode() in p.stderr and (v is None or intact(v)) and (absent is None or not os.path.lexists(absent))
    return case(cls, ok, f"{what}: exit {p.returncode}, victim intact: {v is None or intact(v)}, stderr {p.stderr[-200:]!r}")


def links():
    cls = "links"
    d = small_dumps()
    D = nobody_dir("nobody_dir")
    for flag in ("--json", "--junit"):
        v = victim(f"victim{flag}")
        link = os.path.join(D, f"r{flag}")
        as_nobody("ln", "-sfn", v, link)
        p = gcd(["check", d, flag, link] + (["--no-json"] if flag == "--junit" else []))
        refused(cls, f"check {flag} onto nobody's link (in nobody's directory) to a root-only file", p, link, v)
    # dangling: the target would be created where nobody chose
    target = os.path.join(TMP, "created-by-root")
    link = os.path.join(D, "dangling.json")
    as_nobody("ln", "-sfn", target, link)
    p = gcd(["check", d, "--json", link])
    refused(cls, "check --json onto nobody's dangling link", p, link, absent=target)
    # a directory component that is nobody's link
    vd = os.path.join(TMP, "root_only_dir")
    os.makedirs(vd, exist_ok=True)
    os.chmod(vd, 0o700)
    as_nobody("ln", "-sfn", vd, os.path.join(D, "sub"))
    p = gcd(["check", d, "--json", os.path.join(D, "sub", "r.json")])
    refused(cls, "check --json through nobody's link to a directory", p, os.path.join(D, "sub"), absent=os.path.join(vd, "r.json"))
    # a sticky world-writable directory (/tmp): nobody's link there
    T = nobody_dir("sticky", 0o1777, owner=0)
    v = victim("victim-sticky")
    link = os.path.join(T, "r.json")
    as_nobody("ln", "-sfn", v, link)
    p = gcd(["check", d, "--json", link])
    refused(cls, "check --json onto nobody's link in a sticky /tmp-like directory", p, link, v)
    # run, too, and its default reports/ owned by nobody with a planted name
    v = victim("victim-run")
    link = os.path.join(D, "run.json")
    as_nobody("ln", "-sfn", v, link)
    p = gcd(["run", "--world", "1", "--probe", "simplenet", "--mode", "on", "--json", link], timeout=120)
    refused(cls, "run --json onto nobody's link", p, link, v)
    # root's own link in root's directory is followed (the target is replaced, the link kept)
    mine = os.path.join(TMP, "mine.json")
    real = os.path.join(TMP, "mine-target.json")
    for f in (mine, real):
        if os.path.lexists(f):
            os.unlink(f)
    os.symlink(real, mine)
    p = gcd(["check", d, "--json", mine])
    case(cls, p.returncode in (0, 1) and os.path.islink(mine) and json.load(open(real)).get("schema"),
         f"root's own link is followed: exit {p.returncode} {p.stderr[-200:]!r}")
    # nobody swaps the temporaries for links to a root-only file while root writes into nobody's directory
    v = victim("victim-race")
    stop = [False]
    racer = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c",
                              "import os,sys\nd,v=sys.argv[1],sys.argv[2]\nwhile True:\n"
                              " for n in os.listdir(d):\n"
                              "  if '.tmp.' in n:\n"
                              "   try:\n    os.rename(os.path.join(d,n), os.path.join(d,'moved'))\n    os.symlink(v, os.path.join(d,n))\n"
                              "   except OSError: pass\n", D, v], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ok = True
        for i in range(10):
            gcd(["check", d, "--json", os.path.join(D, f"race{i}.json")])
            ok &= intact(v)
        case(cls, ok, f"nobody swapping the temporary for a link: the victim is {'intact' if intact(v) else 'changed: ' + oct(os.stat(v).st_mode)}")
    finally:
        racer.kill()
        racer.wait()


# ----------------------------------------------------------------------------
# broken streams

def streams():
    cls = "streams"
    d = small_dumps()
    ref = os.path.join(TMP, "small_ref.safetensors")
    rep = os.path.join(TMP, "streams.json")
    gcd(["check", d, "--json", rep])
    commands = {
        "--version": ["--version"], "--help": ["--help"], "check --help": ["check", "--help"],
        "check": ["check", d, "--no-json"], "check --json FILE": ["check", d, "--json", os.path.join(TMP, "s1.json")],
        "check --json -": ["check", d, "--json", "-"], "check --snippet": ["check", "--snippet"],
        "report": ["report", rep], "report --format md": ["report", rep, "--format", "md"],
        "run": ["run", "--world", "1", "--probe", "simplenet", "--mode", "on", "--no-json"],
        "run --json -": ["run", "--world", "1", "--probe", "simplenet", "--mode", "on", "--json", "-"],
    }
    full = open("/dev/full", "wb")
    for name, argv in commands.items():
        # stdout broken: everything of these goes there (the table, the document, the help)
        for how in ("/dev/full", "closed"):
            out = full if how == "/dev/full" else None
            p = subprocess.run([GCD] + argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, timeout=120,
                               close_fds=True, pass_fds=(), preexec_fn=None if out else (lambda: os.close(1)))
            case(cls, p.returncode == 3 and p.stderr.strip(), f"{name} with stdout {how}: exit {p.returncode}, stderr {p.stderr[-160:]!r}")
        # stderr broken where the command writes there (the table of --json -): stdout still says what it can
        if argv[-1] == "-":
            for how in ("/dev/full", "closed"):
                err = full if how == "/dev/full" else None
                p = subprocess.run([GCD] + argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, timeout=120,
                                   preexec_fn=None if err else (lambda: os.close(2)))
                case(cls, p.returncode == 3, f"{name} with stderr {how}: exit {p.returncode}")
    # a file output on a full device: exit 3, never 9 or 99
    p = gcd(["check", d, "--json", "/dev/full"])
    case(cls, p.returncode == 3 and b"/dev/full" in p.stderr, f"check --json /dev/full: exit {p.returncode} {p.stderr[-160:]!r}")
    p = subprocess.run([GCD, "check", d, "--json", os.path.join(TMP, "s2.json")], stdout=full, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60)
    case(cls, p.returncode == 3, f"check --json FILE > /dev/full: exit {p.returncode}")
    # one stream or one file, two documents
    j = os.path.join(TMP, "two.json")
    for f in (j, j + ".lnk", j + ".dangling"):
        if os.path.lexists(f):
            os.unlink(f)
    os.symlink(j, j + ".dangling")
    pairs = [(["--json", "/dev/stdout", "--junit", "-"], "--json /dev/stdout --junit -"),
             (["--json", "-", "--junit", "/dev/stdout"], "--json - --junit /dev/stdout"),
             (["--json", "/dev/stdout", "--junit", "/proc/self/fd/1"], "--json /dev/stdout --junit /proc/self/fd/1"),
             (["--json", j, "--junit", j + ".dangling"], "--junit a dangling link to the --json path")]
    for argv, name in pairs:
        p = gcd(["check", d] + argv)
        case(cls, p.returncode == 2, f"check {name}: exit {p.returncode} {p.stderr[-160:]!r}")
    gcd(["check", d, "--json", j])
    os.symlink(j, j + ".lnk")
    p = gcd(["check", d, "--json", j, "--junit", j + ".lnk"])
    case(cls, p.returncode == 2, f"check --junit a link to the --json file: exit {p.returncode}")
    # the inputs as the output (a copy: a failed refusal must not spoil the cases after it)
    src = d
    d = os.path.join(TMP, "inputs-as-output")
    shutil.copytree(src, d, dirs_exist_ok=True)
    ref = shutil.copy(ref, os.path.join(TMP, "inputs-as-output-ref.safetensors"))
    before = open(ref, "rb").read()
    p = gcd(["check", d, "--ref", ref, "--json", ref])
    case(cls, p.returncode == 2 and open(ref, "rb").read() == before, f"check --json onto its --ref: exit {p.returncode}")
    dump = os.path.join(d, "rank0.safetensors")
    before = open(dump, "rb").read()
    for flag in ("--json", "--junit"):
        shutil.copytree(src, d, dirs_exist_ok=True)
        p = gcd(["check", d, flag, dump])
        case(cls, p.returncode == 2 and open(dump, "rb").read() == before, f"check {flag} onto one of its dumps: exit {p.returncode}")
    p = gcd(["check", dump, os.path.join(d, "rank1.safetensors"), "--junit", os.path.join(d, "rank1.safetensors")])
    case(cls, p.returncode == 2, f"check --junit onto a dump given by name: exit {p.returncode}")
    d = src
    # a FIFO nobody reads
    fifo = os.path.join(TMP, "fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    for flag in ("--json", "--junit"):
        t0 = time.time()
        p = gcd(["check", d, flag, fifo], timeout=30)
        case(cls, p.returncode in (2, 3) and time.time() - t0 < 20, f"check {flag} FIFO without a reader: exit {p.returncode} after {time.time() - t0:.0f} s")
    # a FIFO with a reader still works
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("b", open(fifo, "rb").read()))
    t.start()
    p = gcd(["check", d, "--json", fifo], timeout=30)
    t.join(10)
    case(cls, p.returncode in (0, 1) and got.get("b", b"").startswith(b"{"), f"check --json FIFO with a reader: exit {p.returncode}")


# ----------------------------------------------------------------------------
# reading costs

def peak_of(argv, timeout=120):
    t0 = time.time()
    p = subprocess.Popen([GCD] + argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p.returncode, err, ru.ru_maxrss / 1024, time.time() - t0


def bounds():
    cls = "bounds"
    f = os.path.join(TMP, "zeros.json")
    n = 32 * 1024 * 1024
    with open(f, "wb") as fh:
        fh.write(b'{"schema": "gradcheck-dist.report/3", "x": [' + b"0," * (n - 1) + b"0]}")
    code, err, mb, s = peak_of(["report", f])   # a fresh python child per measure: RUSAGE_CHILDREN is its peak
    case(cls, code in (2, 3) and err.strip() and mb < 700, f"a 64 MiB report of 0, x N: exit {code}, peak {mb:.0f} MB, {s:.1f} s, {err[-160:]!r}")
    base = os.path.join(TMP, "run.json")
    if not os.path.exists(base):
        gcd(["run", "--world", "2", "--probe", "simplenet", "--mode", "off,on", "--json", base], timeout=300)
    doc = json.load(open(base))
    for count in (65536, 100000):
        doc["environment"]["hostnames"] = [f"host{i}" for i in range(count)]
        hf = os.path.join(TMP, f"hosts{count}.json")
        json.dump(doc, open(hf, "w"))
        t0 = time.time()
        p = gcd(["report", hf, "--format", "md"], timeout=60)
        s = time.time() - t0
        case(cls, p.returncode in (0, 1, 2) and s < 5, f"report --format md with {count} host names: exit {p.returncode} in {s:.1f} s")


def echoes():
    cls = "echoes"
    forged_word = b"--x" + PAYLOAD.replace(b"/", b"_")
    for argv in ([forged_word], [b"check", forged_word], [b"run", forged_word], [b"report", b"x", forged_word],
                 [b"check", b"--json" + PAYLOAD.replace(b"/", b"_")]):
        p = gcd(argv, timeout=30)
        case(cls, p.returncode == 2 and not terminal_problems(p.stderr) and not terminal_problems(p.stdout),
             f"{argv[:1]} an unknown word echoed: exit {p.returncode}, {terminal_problems(p.stderr)}")
    d = small_dumps()
    name = os.path.join(TMP, "e").encode() + PAYLOAD.replace(b"/", b"_")
    p = gcd([b"check", d.encode(), b"--ref", os.path.join(TMP, "small_ref.safetensors").encode(),
             b"--json", name + b".json", b"--junit", name + b".xml"], timeout=60)
    case(cls, p.returncode == 0 and not terminal_problems(p.stdout) and not terminal_problems(p.stderr),
         f"check --json/--junit a hostile name, the report: line: exit {p.returncode}, {terminal_problems(p.stdout)}")
    env = dict(os.environ, PMI_FD="3", SLURM_MPI_TYPE=PAYLOAD.decode("utf-8", "surrogateescape"))
    env.pop("OMPI_COMM_WORLD_SIZE", None), env.pop("PMIX_RANK", None), env.pop("PMI_RANK", None)
    p = gcd(["run", "--world", "1", "--no-json"], timeout=30, env=env)
    case(cls, p.returncode == 3 and b"PMI-2" in p.stderr and not terminal_problems(p.stderr),
         f"SLURM_MPI_TYPE echoed: exit {p.returncode}, {terminal_problems(p.stderr)}")
    for var, value, more in (("OMPI_COMM_WORLD_SIZE", "garbage", {}), ("OMPI_COMM_WORLD_SIZE", "0", {}),
                             ("OMPI_COMM_WORLD_RANK", "4", {"OMPI_COMM_WORLD_SIZE": "2"}),
                             ("SLURM_TASKS_PER_NODE", "9223372036854775807(x9223372036854775807)", {"SLURM_JOB_ID": "1"}),
                             ("SLURM_TASKS_PER_NODE", "4611686018427387904,4611686018427387904", {"SLURM_JOB_ID": "1"}),
                             ("SLURM_TASKS_PER_NODE", "2(x", {"SLURM_JOB_ID": "1"})):
        env = dict(os.environ, **more)
        env[var] = value
        t0 = time.time()
        p = gcd(["run", "--world", "2", "--probe", "simplenet", "--no-json"], timeout=60, env=env)
        case(cls, p.returncode == 2 and var.encode() in p.stderr and time.time() - t0 < 10,
             f"{var}={value}: exit {p.returncode} in {time.time() - t0:.1f} s, {p.stderr[-200:]!r}")
    for flag in ("--json", "--junit"):
        p = gcd(["check", d, flag, "./" * 50000 + "r.json"], timeout=30)
        case(cls, p.returncode == 2 and b"PATH_MAX" in p.stderr, f"check {flag} a 100 KB path: exit {p.returncode} {p.stderr[-160:]!r}")


def tmpdir():
    cls = "tmpdir"
    mnt = os.path.join(TMP, "full")
    os.makedirs(mnt)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt], capture_output=True)
    if not case(cls, p.returncode == 0, f"mount a 256 KiB tmpfs (root): {p.stderr[-200:]!r}"):
        return
    try:
        with open(os.path.join(mnt, "fill"), "wb") as f:
            f.write(b"\0" * (232 << 10))
        t0 = time.time()
        p = gcd(["run", "--world", "2", "--probe", "simplenet", "--timeout", "10", "--no-json"], timeout=120,
                env=dict(os.environ, TMPDIR=mnt))
        took = time.time() - t0
        left = sorted(set(os.listdir(mnt)) - {"fill"})
        case(cls, p.returncode == 3 and b"TMPDIR" in p.stderr and took < 10 and not left,
             f"run with TMPDIR nearly full: exit {p.returncode} in {took:.1f} s, left {left}, {p.stderr[-200:]!r}")
    finally:
        subprocess.run(["umount", mnt], capture_output=True)


if __name__ == "__main__":
    if os.geteuid() != 0 and "links" in CLASSES:
        print("test_hostile: links needs root (a second user plants the links): run as root", file=sys.stderr)
        sys.exit(77)
    os.chmod(TMP, 0o755)
    try:
        for c in CLASSES:
            {"forged": forged, "links": links, "streams": streams, "bounds": bounds, "echoes": echoes, "tmpdir": tmpdir}[c]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    for c, (h, n) in held.items():
        print(f"{c}: held {h}/{n}")
    print(f"{sum(h for h, n in held.values())} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)
