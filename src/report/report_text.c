#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "report/report.h"
#include "report/report_render.h"

// ----------------------------------------------------------------------------
// shared readers

const char *gcd_jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

double gcd_jnum(const cJSON *o, const char *key) { return gcd_json_num(cJSON_GetObjectItemCaseSensitive(o, key)); }

int gcd_int_of(double v) { return v == v && v > INT_MIN && v < INT_MAX ? (int)v : -1; }   // NaN is no int

int gcd_jint(const cJSON *o, const char *key) { return gcd_int_of(gcd_jnum(o, key)); }

int gcd_jbool(const cJSON *o, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key)); }

char *gcd_jshape(const cJSON *o, char *buf, size_t len) {
    const cJSON *d;
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "shape"))) return snprintf(buf, len, "-"), buf;   // unknown
    size_t k = (size_t)snprintf(buf, len, "(");
    int i = 0;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(o, "shape")) {
        if (k < len) k += (size_t)snprintf(buf + k, len - k, i++ ? ",%d" : "%d", gcd_int_of(gcd_json_num(d)));
    }
    if (k < len) snprintf(buf + k, len - k, ")");
    return buf;
}

char *gcd_run_title(const cJSON *run, char *buf, size_t len) {
    if (!strcmp(gcd_jstr(run, "probe"), "check")) {
        snprintf(buf, len, "check (stage %s, world %d)", gcd_jstr(run, "stage"), gcd_jint(run, "world"));
        return buf;
    }
    if (!strcmp(gcd_jstr(run, "probe"), "simplenet"))   // only simplenet can give every rank the same inputs
        snprintf(buf, len, "simplenet (inputs %s, world %d)", gcd_jstr(run, "inputs"), gcd_jint(run, "world"));
    else snprintf(buf, len, "%s (%sworld %d)", gcd_jstr(run, "probe"), gcd_jbool(run, "local_loss") ? "local_loss, " : "", gcd_jint(run, "world"));
    return buf;
}

int gcd_run_groups(const cJSON *runs, int *group, int max) {
    char title[64][160];
    int ng = 0, i = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, runs) {
        if (i == max) break;
        char t[160];
        gcd_run_title(r, t, sizeof t);
        int g = 0;
        while (g < ng && strcmp(title[g], t)) g++;
        if (g == ng) snprintf(title[ng++], sizeof title[0], "%s", t);
        group[i++] = g;
    }
    return ng;
}

int gcd_group_runs(const cJSON *runs, const int *group, int g, const cJSON **cols, int max) {
    const cJSON *run;
    int n = 0, i = 0;
    cJSON_ArrayForEach(run, runs) {
        if (i < max && group[i] == g) cols[n++] = run;
        i++;
    }
    return n;
}

void gcd_rows_begin(const cJSON **cur, const cJSON *const *cols, int ncol) {
    for (int c = 0; c < ncol; c++) {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cols[c], "params");
        cur[c] = ps ? ps->child : NULL;
    }
}

void gcd_rows_next(const cJSON **cur, int ncol) {
    for (int c = 0; c < ncol; c++) cur[c] = cur[c] ? cur[c]->next : NULL;
}

// "x0.25", "cos 0.123", "3 ranks", ...: what a cell says beside its status
static void cell_note(const cJSON *p, char *note, size_t len) {
    const char *st = gcd_jstr(p, "status");
    note[0] = 0;
    if (!strcmp(st, "scaled")) snprintf(note, len, "x%.4g", gcd_jnum(p, "scale"));
    else if (!strcmp(st, "mismatch")) snprintf(note, len, "cos %.3f", gcd_jnum(p, "cosine"));
    else if (!strcmp(st, "partial")) snprintf(note, len, "%d ranks", gcd_jint(p, "ranks_with_grad"));
    else if (!strcmp(st, "nonfinite")) snprintf(note, len, "%d bad", gcd_jint(p, "nonfinite"));
    else if (!strcmp(st, "disagree")) snprintf(note, len, "ranks %.1e", gcd_jnum(p, "rank_diff_rel"));
    else if (!strcmp(st, "undecided")) snprintf(note, len, "err %.1e", gcd_jnum(p, "rel_err"));
}

char *gcd_cell(const cJSON *p, char *buf, size_t len) {
    double norm = gcd_jnum(p, "norm");
    char n[16] = "-", note[24];
    if (!isnan(norm)) snprintf(n, sizeof n, "%.3e", norm);
    cell_note(p, note, sizeof note);
    snprintf(buf, len, "%-9s %-9s %s", gcd_jstr(p, "status"), n, note);
    return buf;
}

int gcd_chain(gcd_sb *b, const cJSON *p) {
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(p, "path"), *e;
    if (!cJSON_GetArraySize(path)) return 0;
    const char *st = gcd_jstr(p, "status");
    int at = gcd_jint(p, "breaks_at"), j = 0, cut = !strcmp(st, "none") || !strcmp(st, "partial");
    cJSON_ArrayForEach(e, path) {
        const char *op = gcd_jstr(e, "op"), *name = gcd_jstr(e, "name");
        if (j) gcd_sb_printf(b, " -> ");
        if (!strcmp(op, "parameter")) gcd_sb_printf(b, "%s", name);
        else if (!*name) gcd_sb_printf(b, "%s", op);
        else gcd_sb_printf(b, !strcmp(op, "all_gather") ? "%s[%s]" : "%s(%s)", op, name);
        if (j++ == at) gcd_sb_printf(b, " %s %s", cut || gcd_jbool(e, "detached") ? "✂" : "≠", gcd_jstr(e, "reason"));
    }
    return 1;
}

const cJSON *gcd_finding_param(const cJSON *run, const cJSON *f) {
    static const char *const kinds[] = { "none", "partial", "scaled", "mismatch" };
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(f, "params"), 0), *p;
    int has_path = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) has_path |= !strcmp(gcd_jstr(f, "kind"), kinds[k]);
    if (!has_path || !cJSON_IsString(first)) return NULL;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(run, "params")) {
        if (!strcmp(gcd_jstr(p, "name"), first->valuestring)) return p;
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// the width: COLUMNS, else the terminal's, else 100

int gcd_text_width(int fd) {
    const char *c = getenv("COLUMNS");
    char *end;
    long w = c && *c ? strtol(c, &end, 10) : 0;
    struct winsize ws;
    if (!(c && *c && !*end && w > 0) && isatty(fd) && ioctl(fd, TIOCGWINSZ, &ws) == 0) w = ws.ws_col;
    if (w <= 0) w = 100;
    return w < GCD_TEXT_MIN_WIDTH ? GCD_TEXT_MIN_WIDTH : w > 1000 ? 1000 : (int)w;
}

// display columns of s's first n bytes: UTF-8 continuation bytes take none (✂, ≠, the sparkline's bars)
static int ncols(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n && s[i]; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

// text in lines of at most width columns: the first after lead, the others indented by as much, and
// by two at least (a name with spaces in it never starts a line of its own: "result: pass" there would
// read as the tool's). It breaks at spaces only: a word longer than a line (a file path) runs over.
static void wrap(gcd_sb *b, int width, const char *lead, const char *text) {
    int hang = ncols(lead, strlen(lead)), at = hang, fresh = 1;
    gcd_sb_printf(b, "%s", lead);
    hang = hang < 2 ? 2 : hang;
    for (const char *w = text; *w;) {
        if (*w == ' ' || *w == '\n') { w++; continue; }
        size_t n = strcspn(w, " \n");
        int c = ncols(w, n);
        if (!fresh && at + 1 + c > width) gcd_sb_printf(b, "\n%*s", hang, ""), at = hang, fresh = 1;
        gcd_sb_printf(b, "%s%.*s", fresh ? "" : " ", (int)n, w);
        at += c + !fresh;
        fresh = 0;
        w += n;
    }
    gcd_sb_printf(b, "\n");
}

// A gradient path, broken before its arrows: "path: a -> b" then "-> c" lines under it; a step too
// long for a line of its own is broken at its spaces, under its first word.
static void wrap_path(gcd_sb *b, int width, const char *chain) {
    static const char lead[] = "          path: ", arrow[] = " -> ";
    int hang = (int)sizeof lead - 1 - 3, at = hang + 3;
    gcd_sb_printf(b, "%s", lead);
    for (const char *s = chain, *e; *s; s = e + (*e ? sizeof arrow - 1 : 0)) {
        e = strstr(s, arrow);
        if (!e) e = s + strlen(s);
        int c = ncols(s, (size_t)(e - s));
        if (s == chain || at + 4 + c <= width) {
            gcd_sb_printf(b, "%s%.*s", s == chain ? "" : arrow, (int)(e - s), s), at += (s == chain ? 0 : 4) + c;
            continue;
        }
        gcd_sb_printf(b, "\n%*s->", hang, ""), at = hang + 2;
        int lines = 1;
        for (const char *w = s; w < e;) {   // the step's words
            if (*w == ' ') { w++; continue; }
            const char *sp = memchr(w, ' ', (size_t)(e - w));
            size_t n = sp ? (size_t)(sp - w) : (size_t)(e - w);
            int wc = ncols(w, n);
            if (at > hang + 2 && at + 1 + wc > width) gcd_sb_printf(b, "\n%*s", hang + 2, ""), at = hang + 2, lines++;
            gcd_sb_printf(b, " %.*s", (int)n, w), at += 1 + wc;
            w += n;
        }
        if (lines > 1) at = width;   // the next step starts a line of its own
    }
    gcd_sb_printf(b, "\n");
}

// ----------------------------------------------------------------------------
// the text report

#define MAX_RUNS 64

// How a table fits the width: every mode side by side with its norms; else side by side without the
// norms; else the modes stacked in blocks of `per` (at least 2) with norms; else blocks without norms;
// else, one mode a block, without the shapes; else a name too long for its column gets a line of its own.
typedef struct {
    int nw, sw, dw;   // the name, shape (0: dropped) and dtype (0: none) columns
    int own;          // a name longer than nw goes on a line of its own, its cells under it
    int norms, cw;    // cells show |g|; a cell's width
    int per;          // modes a block
    int need;         // the width every mode side by side with its norms takes
} layout;

static const char sub_norms[] = "status    |g|       vs ref", sub_brief[] = "status    vs ref";

static char *cell_text(const cJSON *p, int norms, char *buf, size_t len) {
    char note[24];
    if (!p) snprintf(buf, len, "?");
    else if (norms) gcd_cell(p, buf, len);
    else cell_note(p, note, sizeof note), snprintf(buf, len, "%-9s %s", gcd_jstr(p, "status"), note);
    return buf;
}

static int cell_width(const cJSON *const *cols, int ncol, int norms) {
    int w = (int)strlen(norms ? sub_norms : sub_brief);
    char c[64];
    const cJSON *cur[MAX_RUNS] = { 0 };
    for (int k = 0; k < ncol; k++) {
        int h = (int)strlen(gcd_jstr(cols[k], "mode")) + 3 + (int)strlen(gcd_jstr(cols[k], "role"));
        w = h > w ? h : w;
    }
    gcd_rows_begin(cur, cols, ncol);
    for (; cur[0]; gcd_rows_next(cur, ncol))
        for (int k = 0; k < ncol; k++) {
            int n = (int)strlen(cell_text(cur[k], norms, c, sizeof c));
            w = n > w ? n : w;
        }
    return w;
}

static int lead_width(const layout *L) { return 2 + L->nw + (L->sw ? 1 + L->sw : 0) + (L->dw ? 1 + L->dw : 0); }

static layout fit(int width, const cJSON *const *cols, int ncol, int nw, int sw, int dw) {
    layout L = { .nw = nw, .sw = sw, .dw = dw, .norms = 1, .cw = cell_width(cols, ncol, 1), .per = ncol };
    int brief = cell_width(cols, ncol, 0);
    L.need = lead_width(&L) + ncol * (3 + L.cw);
    if (L.need <= width) return L;
    if (lead_width(&L) + ncol * (3 + brief) <= width) return L.norms = 0, L.cw = brief, L;
    L.per = (width - lead_width(&L)) / (3 + L.cw);
    if (L.per >= 2) return L;
    L.norms = 0, L.cw = brief;
    L.per = (width - lead_width(&L)) / (3 + L.cw);
    if (L.per >= 1) return L;
    L.per = 1;
    if (lead_width(&L) + 3 + brief <= width) return L;
    L.sw = 0;
    if (lead_width(&L) + 3 + brief <= width) return L;
    L.own = 1;   // then only a name longer than the whole line runs over
    L.nw = width - (3 + brief) - (lead_width(&L) - L.nw);
    L.nw = L.nw < 9 ? 9 : L.nw;
    return L;
}

static void row_lead(gcd_sb *b, const layout *L, const char *name, const char *shape, const char *dtype) {
    if (L->own && (int)strlen(name) > L->nw) gcd_sb_printf(b, "  %s\n", name), name = "";
    gcd_sb_printf(b, "  %-*s", L->nw, name);
    if (L->sw) gcd_sb_printf(b, " %-*s", L->sw, shape);
    if (L->dw) gcd_sb_printf(b, " %-*s", L->dw, dtype);
}

// mean over ranks of step s
static double step_mean(const cJSON *row) {
    const cJSON *x;
    double sum = 0;
    int k = 0;
    cJSON_ArrayForEach(x, row) sum += gcd_json_num(x), k++;
    return k ? sum / k : NAN;
}

// the whole series in at most `width` columns (40 at most), each the step at its place; first and
// last are the real ends
static void sparkline(gcd_sb *b, const cJSON *steps, int width) {
    static const char *bar[8] = { "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█" };
    int n = cJSON_GetArraySize(steps);
    double lo = INFINITY, hi = -INFINITY, first = NAN, last = NAN;
    const cJSON *row;
    int s = 0;
    cJSON_ArrayForEach(row, steps) {
        double v = step_mean(row);
        if (s == 0) first = v;
        last = v;
        if (isfinite(v)) lo = fmin(lo, v), hi = fmax(hi, v);   // the scale from finite losses only
        s++;
    }
    gcd_sb_printf(b, "%-10.6g ", first);
    width = width > 40 ? 40 : width < 4 ? 4 : width;
    width = n < width ? n : width;
    int col = 0;
    s = 0;
    cJSON_ArrayForEach(row, steps) {   // one pass: the column's step comes up in order
        if (col < width && s == (int)((long)col * (n - 1) / (width > 1 ? width - 1 : 1))) {
            double x = step_mean(row);
            double at = hi > lo && isfinite(x) ? (x - lo) / (hi - lo) * 7.999 : 0;
            int level = at > 0 ? (at < 7 ? (int)at : 7) : 0;
            gcd_sb_printf(b, "%s", isfinite(x) ? bar[level] : "?");
            col++;
        }
        s++;
    }
    gcd_sb_printf(b, " %.6g\n", last);
}

// the notes (findings that do not count) already printed: a note every run repeats is printed once
typedef struct {
    const char *msg[256];
    int n;
} seen_notes;

static int seen(seen_notes *s, const char *msg, int add) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->msg[i], msg)) return 1;
    if (add && s->n < 256) s->msg[s->n++] = msg;
    return 0;
}

// does any param of the run have a forward path (run's probes do; check's never)
static int any_path(const cJSON *run) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(run, "params"))
        if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(p, "path")) > 0) return 1;
    return 0;
}

// how many of the columns hold a note with this message

static int note_in(const cJSON *const *cols, int ncol, const char *msg) {
    int n = 0;
    for (int c = 0; c < ncol; c++) {
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(cols[c], "findings")) {
            if (!gcd_jbool(f, "counts") && !strcmp(gcd_jstr(f, "message"), msg)) { n++; break; }
        }
    }
    return n;
}

static void group_table(gcd_sb *b, const cJSON *runs, const int *group, int g, int width, seen_notes *notes) {
    const cJSON *cols[MAX_RUNS] = { 0 };
    int ncol = gcd_group_runs(runs, group, g, cols, MAX_RUNS);
    char t[160], cell[64], shp[96], line[512];
    int nw = 12, sw = 7;   // the name and shape columns fit the longest (within reason)
    const cJSON *p0;
    cJSON_ArrayForEach(p0, cJSON_GetObjectItemCaseSensitive(cols[0], "params")) {
        int k = (int)strlen(gcd_jstr(p0, "name")), s = (int)strlen(gcd_jshape(p0, shp, sizeof shp));
        nw = k > nw ? (k < 60 ? k : 60) : nw;
        sw = s > sw ? (s < 24 ? s : 24) : sw;
    }
    int check = !strcmp(gcd_jstr(cols[0], "probe"), "check");
    layout L = fit(width, cols, ncol, nw, sw, check ? 5 : 0);
    wrap(b, width, "", gcd_run_title(cols[0], t, sizeof t));
    const cJSON *cur[MAX_RUNS] = { 0 };
    for (int c0 = 0; c0 < ncol; c0 += L.per) {   // one block of modes side by side
        int c1 = c0 + L.per < ncol ? c0 + L.per : ncol;
        row_lead(b, &L, "parameter", "shape", "dtype");
        for (int c = c0; c < c1; c++) {
            snprintf(line, sizeof line, "%s (%s)", gcd_jstr(cols[c], "mode"), gcd_jstr(cols[c], "role"));
            gcd_sb_printf(b, " | %-*s", L.cw, line);
        }
        gcd_sb_printf(b, "\n");
        row_lead(b, &L, "", "", "");
        for (int c = c0; c < c1; c++) gcd_sb_printf(b, " | %-*s", L.cw, L.norms ? sub_norms : sub_brief);
        gcd_sb_printf(b, "\n");
        gcd_rows_begin(cur, cols, ncol);
        for (; cur[0]; gcd_rows_next(cur, ncol)) {
            p0 = cur[0];
            row_lead(b, &L, gcd_jstr(p0, "name"), gcd_jshape(p0, shp, sizeof shp), *gcd_jstr(p0, "dtype") ? gcd_jstr(p0, "dtype") : "-");
            for (int c = c0; c < c1; c++) gcd_sb_printf(b, " | %-*s", L.cw, cell_text(cur[c], L.norms, cell, sizeof cell));
            gcd_sb_printf(b, "\n");
        }
    }
    int reduced = check && strcmp(gcd_jstr(cols[0], "stage"), "local");
    char norm[192];
    const char *by = gcd_jstr(cols[0], "reduced_by");   // the wrapper the dumps record; DDP where they record none
    if (!L.norms) snprintf(norm, sizeof norm, "|g| left out at this width (COLUMNS=%d shows it);", L.need);
    else if (!check || !reduced || !*by || !strcmp(by, "DDP's all-reduce"))
        snprintf(norm, sizeof norm, "|g|: L2 norm of %s;", !check     ? "the DDP-mean gradient"
                                                          : !reduced ? "the DDP mean of the ranks' local gradients (None as zeros)"
                                                                     : "the gradient every rank holds after DDP");
    else snprintf(norm, sizeof norm, "|g|: L2 norm of the gradient the ranks hold after %s;", by);
    snprintf(line, sizeof line, "%s%s xC: g = C * reference; cos: cosine to the reference", norm,
             reduced ? " ranks R: the ranks' largest relative difference;" : "");
    wrap(b, width, "  ", line);
    for (int c = 0; c < ncol; c++) {
        const cJSON *f;
        int paths = any_path(cols[c]);   // check's params have none: no lookup per finding (O(n^2) with 20k partial)
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(cols[c], "findings")) {
            const char *msg = gcd_jstr(f, "message"), *mode = gcd_jstr(cols[c], "mode");
            int counts = gcd_jbool(f, "counts");
            if (!counts && ncol > 1 && note_in(cols, ncol, msg) == ncol) {   // world 1's note on every run: once
                if (seen(notes, msg, 1)) continue;
                mode = "all";
            }
            if (check) snprintf(line, sizeof line, "  %s ", counts ? "!" : "-");
            else snprintf(line, sizeof line, "  %-5s %s ", mode, counts ? "!" : "-");
            wrap(b, width, line, msg);
            const cJSON *p = paths ? gcd_finding_param(cols[c], f) : NULL;
            gcd_sb chain = { 0 };
            if (p && gcd_chain(&chain, p)) wrap_path(b, width, chain.s);
            gcd_sb_free(&chain);
        }
    }
    if (gcd_jnum(cols[0], "steps") > 0) {
        snprintf(line, sizeof line, "loss over %d SGD steps (lr %g, mean over ranks): first, curve, last", gcd_jint(cols[0], "steps"),
                 gcd_jnum(cols[0], "lr"));
        wrap(b, width, "  ", line);
        for (int c = 0; c < ncol; c++) {
            gcd_sb_printf(b, "    %-6s ", gcd_jstr(cols[c], "mode"));
            sparkline(b, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cols[c], "loss"), "per_step"), width - 36);
        }
        wrap(b, width, "  ", "how far each parameter moved, ||end - start||");
        int per = (width - lead_width(&L)) / 17;
        per = per < 1 ? 1 : per;
        for (int c0 = 0; c0 < ncol; c0 += per) {
            int c1 = c0 + per < ncol ? c0 + per : ncol;
            row_lead(b, &L, "parameter", "shape", "dtype");
            for (int c = c0; c < c1; c++) gcd_sb_printf(b, " | %-14s", gcd_jstr(cols[c], "mode"));
            gcd_sb_printf(b, "\n");
            gcd_rows_begin(cur, cols, ncol);
            for (; cur[0]; gcd_rows_next(cur, ncol)) {
                p0 = cur[0];
                row_lead(b, &L, gcd_jstr(p0, "name"), gcd_jshape(p0, shp, sizeof shp), "");
                for (int c = c0; c < c1; c++) {
                    const cJSON *p = cur[c];
                    if (p && !gcd_jbool(p, "moved_any")) snprintf(cell, sizeof cell, "0 (never)");
                    else snprintf(cell, sizeof cell, "%.3e", p ? gcd_jnum(p, "moved") : NAN);
                    gcd_sb_printf(b, " | %-14s", cell);
                }
                gcd_sb_printf(b, "\n");
            }
        }
    }
    gcd_sb_printf(b, "\n");
}

// what the result means, in the run's own terms
static const char *result_meaning(const cJSON *doc, int check) {
    const char *result = gcd_jstr(doc, "result");
    int controls = 0, test_failed = 0, control_failed = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "expectations")) {
        int control = !strcmp(gcd_jstr(e, "role"), "control");
        controls += control;
        if (!gcd_jbool(e, "met")) control ? control_failed++ : test_failed++;
    }
    if (!strcmp(result, "error")) return "error: the run failed before a verdict (the error above); the findings so far are not a verdict";
    if (check) return !strcmp(result, "pass") ? "pass: the dumps' gradients show no finding" : "fail: the dumps' gradients have the findings marked ! above";
    if (!strcmp(result, "pass"))
        return controls ? "pass: the configuration under test is clean and every known-bad configuration was caught"
                        : "pass: every configuration under test is clean";
    if (test_failed && control_failed)
        return "fail: the configuration under test has gradient findings, and a known-bad configuration was not caught as expected (FAIL above)";
    if (control_failed) return "fail: a known-bad configuration was not caught as expected (FAIL above): the tool or this MPI setup is in doubt";
    return "fail: the configuration under test has gradient findings (FAIL above)";
}

char *gcd_render_text(const cJSON *doc) { return gcd_render_text_width(doc, gcd_text_width(STDOUT_FILENO)); }

static char *render_text(const cJSON *doc, int width) {
    gcd_sb b = { 0 };
    char line[2048];
    width = width < GCD_TEXT_MIN_WIDTH ? GCD_TEXT_MIN_WIDTH : width;
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(doc, "environment");
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs");
    const cJSON *r0 = cJSON_GetArrayItem(runs, 0);
    const char *version = gcd_jstr(cJSON_GetObjectItemCaseSensitive(doc, "tool"), "version");
    int check = !strcmp(gcd_jstr(r0, "probe"), "check");
    if (check) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(r0, "reference"), *dumps = cJSON_GetObjectItemCaseSensitive(r0, "dumps");
        char tol_why[128] = " (from the dtypes)";   // or from the precision the dumps name (check.c)
        if (*gcd_jstr(r0, "tolerance_reason")) snprintf(tol_why, sizeof tol_why, " (from %.100s)", gcd_jstr(r0, "tolerance_reason"));
        const cJSON *ref2 = cJSON_GetObjectItemCaseSensitive(r0, "reference2");
        char refs[PATH_MAX + 64] = "", tols[160];
        if (cJSON_IsObject(ref2)) snprintf(refs, sizeof refs, " and %.4000s (noise measured, k %g)", gcd_jstr(ref2, "path"), gcd_jnum(r0, "noise_k"));
        if (gcd_jnum(r0, "tolerance") != gcd_jnum(r0, "tolerance_from_dtypes")) snprintf(tols, sizeof tols, "tolerance %g (--tol)", gcd_jnum(doc, "tolerance"));
        else snprintf(tols, sizeof tols, "tolerance per tensor, the loosest %g%s", gcd_jnum(doc, "tolerance"), tol_why);
        snprintf(line, sizeof line, "gradcheck-dist %s: check, %d dumps (stage %s, %s%s), reference %s%s, %s", version, cJSON_GetArraySize(dumps),
                 gcd_jstr(r0, "stage"), gcd_jstr(cJSON_GetArrayItem(dumps, 0), "path"), cJSON_GetArraySize(dumps) > 1 ? ", ..." : "",
                 cJSON_IsObject(ref) ? gcd_jstr(ref, "path") : "none (--ref)", refs, tols);
        wrap(&b, width, "", line);
        const char *tv = gcd_jstr(env, "torch_version"), *lv = gcd_jstr(env, "lightning_version");
        if (*tv || *lv) gcd_sb_printf(&b, "dumped with torch %s%s%s\n", *tv ? tv : "?", *lv ? ", lightning " : "", lv);
        const cJSON *meta0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(dumps, 0), "metadata");
        if (*gcd_jstr(meta0, "gradcheck.sketch")) {   // sketch dumps: the figures against the reference are estimates
            snprintf(line, sizeof line, "sketch dumps (K=%.12s, seed %.12s): the differences from the reference are estimated from the sketches "
                     "(what they can miss: docs/check-verdicts.md)", gcd_jstr(meta0, "gradcheck.sketch"), gcd_jstr(meta0, "gradcheck.seed"));
            wrap(&b, width, "", line);
        }
        gcd_sb_printf(&b, "\n");
    } else {
        snprintf(line, sizeof line, "gradcheck-dist %s: backend %s, world %d, %s, tolerance %g", version, gcd_jstr(env, "backend"),
                 gcd_jint(env, "world"), gcd_jstr(env, "precision"), gcd_jnum(doc, "tolerance"));
        wrap(&b, width, "", line);
        gcd_sb_printf(&b, "\n");
    }
    int group[MAX_RUNS];
    int ng = gcd_run_groups(runs, group, MAX_RUNS), nruns = cJSON_GetArraySize(runs);
    seen_notes notes = { 0 };
    for (int g = 0; g < ng; g++) group_table(&b, runs, group, g, width, &notes);
    if (nruns > MAX_RUNS) {
        snprintf(line, sizeof line, "(%d more runs are in the report; the tables show the first %d)", nruns - MAX_RUNS, MAX_RUNS);
        wrap(&b, width, "", line);
        gcd_sb_printf(&b, "\n");
    }
    const char *stage = gcd_jstr(r0, "stage"), *by = gcd_jstr(r0, "reduced_by");
    char key_reduced[160], key_local[200];   // the step the dumps record (DDP's all-reduce where they record none)
    if (!by || !*by) by = "DDP's all-reduce";
    snprintf(key_reduced, sizeof key_reduced, "! a finding; - a note; stage reduced: the dumps were written after %s", by);
    snprintf(key_local, sizeof key_local, "! a finding; - a note; stage local: the dumps were written before %s, averaged here as %s does", by,
             !strcmp(by, "DDP's all-reduce") ? "DDP" : "it");
    if (ng) wrap(&b, width, "key: ", !check ? "! a finding; - a note; (test) the configuration under test, which must show no finding; "
                                              "(control) a configuration known to drop or scale gradients, which the tool must catch"
                                     : !strcmp(stage, "reduced") ? key_reduced
                                     : !strcmp(stage, "local") ? key_local
                                                               : "! a finding; - a note");
    const cJSON *e;
    int shown = 0;   // check: the findings above are the whole verdict
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "expectations")) {
        if (check) break;
        if (!shown++) gcd_sb_printf(&b, "\nexpectations\n");
        wrap(&b, width, gcd_jbool(e, "met") ? "  ok   " : "  FAIL ", gcd_jstr(e, "message"));
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    if (cJSON_IsObject(err)) {
        snprintf(line, sizeof line, "error on rank %d: ", gcd_jint(err, "rank"));
        wrap(&b, width, line, gcd_jstr(err, "message"));
    }
    gcd_sb_printf(&b, "result: %s (exit %d)\n", gcd_jstr(doc, "result"), gcd_jint(doc, "exit_code"));
    wrap(&b, width, "  ", result_meaning(doc, check));
    size_t k = 0;   // no trailing blanks: the last column is padded
    for (size_t i = 0; i < b.len; i++) {
        if (b.s[i] == '\n')
            while (k > 0 && b.s[k - 1] == ' ') k--;
        b.s[k++] = b.s[i];
    }
    b.s[k] = 0;
    return b.s;
}

// every string as a terminal may show it: no name or message starts a line or moves the cursor
char *gcd_render_text_width(const cJSON *doc, int width) {
    cJSON *copy;
    char *text = render_text(gcd_report_safe(doc, &copy), width);
    cJSON_Delete(copy);
    return text;
}
