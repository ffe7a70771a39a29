#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "report.h"
#include "report_render.h"

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

char *gcd_cell(const cJSON *p, char *buf, size_t len) {
    const char *st = gcd_jstr(p, "status");
    double norm = gcd_jnum(p, "norm");
    char n[16] = "-", note[24] = "";
    if (!isnan(norm)) snprintf(n, sizeof n, "%.3e", norm);
    if (!strcmp(st, "scaled")) snprintf(note, sizeof note, "x%.4g", gcd_jnum(p, "scale"));
    else if (!strcmp(st, "mismatch")) snprintf(note, sizeof note, "cos %.3f", gcd_jnum(p, "cosine"));
    else if (!strcmp(st, "partial")) snprintf(note, sizeof note, "%d ranks", gcd_jint(p, "ranks_with_grad"));
    else if (!strcmp(st, "nonfinite")) snprintf(note, sizeof note, "%d bad", gcd_jint(p, "nonfinite"));
    else if (!strcmp(st, "disagree")) snprintf(note, sizeof note, "ranks %.1e", gcd_jnum(p, "rank_diff_rel"));
    snprintf(buf, len, "%-9s %-9s %s", st, n, note);
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
// the text report

#define CELL 30
#define MAX_RUNS 64

// mean over ranks of step s
static double step_mean(const cJSON *row) {
    const cJSON *x;
    double sum = 0;
    int k = 0;
    cJSON_ArrayForEach(x, row) sum += gcd_json_num(x), k++;
    return k ? sum / k : NAN;
}

// the whole series in at most 40 columns, each the step at its place; first and last are the real ends
static void sparkline(gcd_sb *b, const cJSON *steps) {
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
    int width = n < 40 ? n : 40, col = 0;
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

static void group_table(gcd_sb *b, const cJSON *runs, const int *group, int g) {
    const cJSON *cols[MAX_RUNS] = { 0 };
    int ncol = gcd_group_runs(runs, group, g, cols, MAX_RUNS);
    char t[160], cell[64], shp[96];
    int NW = 12, SW = 7;   // the name and shape columns fit the longest (within reason)
    const cJSON *p0;
    cJSON_ArrayForEach(p0, cJSON_GetObjectItemCaseSensitive(cols[0], "params")) {
        int k = (int)strlen(gcd_jstr(p0, "name")), s = (int)strlen(gcd_jshape(p0, shp, sizeof shp));
        NW = k > NW ? (k < 60 ? k : 60) : NW;
        SW = s > SW ? (s < 24 ? s : 24) : SW;
    }
    int check = !strcmp(gcd_jstr(cols[0], "probe"), "check");
    gcd_sb_printf(b, "%s\n", gcd_run_title(cols[0], t, sizeof t));
    gcd_sb_printf(b, "  %-*s %-*s", NW, "parameter", SW, "shape");
    if (check) gcd_sb_printf(b, " dtype");
    for (int c = 0; c < ncol; c++) {
        char h[48];
        snprintf(h, sizeof h, "%s (%s)", gcd_jstr(cols[c], "mode"), gcd_jstr(cols[c], "role"));
        gcd_sb_printf(b, " | %-*s", CELL, h);
    }
    gcd_sb_printf(b, "\n  %-*s %-*s", NW, "", SW, "");
    if (check) gcd_sb_printf(b, "      ");
    for (int c = 0; c < ncol; c++) gcd_sb_printf(b, " | %-*s", CELL, "status    |g|       vs ref");
    gcd_sb_printf(b, "\n");
    const cJSON *cur[MAX_RUNS] = { 0 };
    gcd_rows_begin(cur, cols, ncol);
    for (; cur[0]; gcd_rows_next(cur, ncol)) {
        p0 = cur[0];
        gcd_sb_printf(b, "  %-*s %-*s", NW, gcd_jstr(p0, "name"), SW, gcd_jshape(p0, shp, sizeof shp));
        if (check) gcd_sb_printf(b, " %-5s", *gcd_jstr(p0, "dtype") ? gcd_jstr(p0, "dtype") : "-");
        for (int c = 0; c < ncol; c++) gcd_sb_printf(b, " | %-*s", CELL, cur[c] ? gcd_cell(cur[c], cell, sizeof cell) : "?");
        gcd_sb_printf(b, "\n");
    }
    if (!check) gcd_sb_printf(b, "  |g|: L2 norm of the DDP-mean gradient; xC: g = C * reference; cos: cosine to the reference\n");
    else if (!strcmp(gcd_jstr(cols[0], "stage"), "local"))
        gcd_sb_printf(b, "  |g|: L2 norm of the DDP mean of the ranks' local gradients (None as zeros); xC: g = C * reference; cos: cosine to the reference\n");
    else gcd_sb_printf(b, "  |g|: L2 norm of the gradient every rank holds after DDP; ranks R: the ranks' largest relative difference; xC: g = C * reference; cos: cosine\n");
    for (int c = 0; c < ncol; c++) {
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(cols[c], "findings")) {
            if (check) gcd_sb_printf(b, "  %s %s\n", gcd_jbool(f, "counts") ? "!" : "-", gcd_jstr(f, "message"));
            else gcd_sb_printf(b, "  %-5s %s %s\n", gcd_jstr(cols[c], "mode"), gcd_jbool(f, "counts") ? "!" : "-", gcd_jstr(f, "message"));
            const cJSON *p = gcd_finding_param(cols[c], f);
            gcd_sb chain = { 0 };
            if (p && gcd_chain(&chain, p)) gcd_sb_printf(b, "          path: %s\n", chain.s);
            gcd_sb_free(&chain);
        }
    }
    if (gcd_jnum(cols[0], "steps") > 0) {
        gcd_sb_printf(b, "  loss over %d SGD steps (lr %g, mean over ranks): first, curve, last\n", gcd_jint(cols[0], "steps"),
                      gcd_jnum(cols[0], "lr"));
        for (int c = 0; c < ncol; c++) {
            gcd_sb_printf(b, "    %-6s ", gcd_jstr(cols[c], "mode"));
            sparkline(b, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cols[c], "loss"), "per_step"));
        }
        gcd_sb_printf(b, "  how far each parameter moved, ||end - start||\n  %-*s %-*s", NW, "parameter", SW, "shape");
        for (int c = 0; c < ncol; c++) gcd_sb_printf(b, " | %-14s", gcd_jstr(cols[c], "mode"));
        gcd_sb_printf(b, "\n");
        gcd_rows_begin(cur, cols, ncol);
        for (; cur[0]; gcd_rows_next(cur, ncol)) {
            p0 = cur[0];
            gcd_sb_printf(b, "  %-*s %-*s", NW, gcd_jstr(p0, "name"), SW, gcd_jshape(p0, shp, sizeof shp));
            for (int c = 0; c < ncol; c++) {
                const cJSON *p = cur[c];
                if (p && !gcd_jbool(p, "moved_any")) snprintf(cell, sizeof cell, "0 (never)");
                else snprintf(cell, sizeof cell, "%.3e", p ? gcd_jnum(p, "moved") : NAN);
                gcd_sb_printf(b, " | %-14s", cell);
            }
            gcd_sb_printf(b, "\n");
        }
    }
    gcd_sb_printf(b, "\n");
}

char *gcd_render_text(const cJSON *doc) {
    gcd_sb b = { 0 };
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(doc, "environment");
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs");
    const cJSON *r0 = cJSON_GetArrayItem(runs, 0);
    const char *version = gcd_jstr(cJSON_GetObjectItemCaseSensitive(doc, "tool"), "version");
    if (!strcmp(gcd_jstr(r0, "probe"), "check")) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(r0, "reference"), *dumps = cJSON_GetObjectItemCaseSensitive(r0, "dumps");
        gcd_sb_printf(&b, "gradcheck-dist %s: check, %d dumps (stage %s, %s%s), reference %s, tolerance %g%s\n",
                      version, cJSON_GetArraySize(dumps), gcd_jstr(r0, "stage"), gcd_jstr(cJSON_GetArrayItem(dumps, 0), "path"),
                      cJSON_GetArraySize(dumps) > 1 ? ", ..." : "", cJSON_IsObject(ref) ? gcd_jstr(ref, "path") : "none (--ref)",
                      gcd_jnum(doc, "tolerance"),
                      gcd_jnum(r0, "tolerance") == gcd_jnum(r0, "tolerance_from_dtypes") ? " (from the dtypes)" : " (--tol)");
        const char *tv = gcd_jstr(env, "torch_version"), *lv = gcd_jstr(env, "lightning_version");
        if (*tv || *lv) gcd_sb_printf(&b, "dumped with torch %s%s%s\n", *tv ? tv : "?", *lv ? ", lightning " : "", lv);
        gcd_sb_printf(&b, "\n");
    } else {
        gcd_sb_printf(&b, "gradcheck-dist %s: backend %s, world %d, %s, tolerance %g\n\n", version, gcd_jstr(env, "backend"),
                      gcd_jint(env, "world"), gcd_jstr(env, "precision"), gcd_jnum(doc, "tolerance"));
    }
    int group[MAX_RUNS];
    int ng = gcd_run_groups(runs, group, MAX_RUNS), nruns = cJSON_GetArraySize(runs);
    for (int g = 0; g < ng; g++) group_table(&b, runs, group, g);
    if (nruns > MAX_RUNS) gcd_sb_printf(&b, "(%d more runs are in the report; the tables show the first %d)\n\n", nruns - MAX_RUNS, MAX_RUNS);
    const cJSON *e;
    int shown = 0, check = !strcmp(gcd_jstr(r0, "probe"), "check");   // check: the findings above are the whole verdict
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "expectations")) {
        if (check) break;
        if (!shown++) gcd_sb_printf(&b, "expectations\n");
        gcd_sb_printf(&b, "  %-4s %s\n", gcd_jbool(e, "met") ? "ok" : "FAIL", gcd_jstr(e, "message"));
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    if (cJSON_IsObject(err)) gcd_sb_printf(&b, "error on rank %d: %s\n", gcd_jint(err, "rank"), gcd_jstr(err, "message"));
    gcd_sb_printf(&b, "result: %s (exit %d)\n", gcd_jstr(doc, "result"), gcd_jint(doc, "exit_code"));
    size_t k = 0;   // no trailing blanks: the last column is padded
    for (size_t i = 0; i < b.len; i++) {
        if (b.s[i] == '\n')
            while (k > 0 && b.s[k - 1] == ' ') k--;
        b.s[k++] = b.s[i];
    }
    b.s[k] = 0;
    return b.s;
}
