/*
 * report_md: a report as a GitHub ticket body a library maintainer reads in one screen: a title in the
 * library's terms from the findings' numbers, the environment, the findings, one compact table per
 * probe, the command, and a PyTorch script that reproduces the finding with the library's own gather.
 * Always under GCD_MD_MAX characters (GitHub refuses bodies over 65536): every section has a budget,
 * and values too large for a ticket stay in the JSON report, which the script then reads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "report/report_render.h"

#define MAX_RUNS 64
#define FINDINGS_UNTIL 16000      // no further finding once the body is this long
#define TABLES_UNTIL 30000        // no further table row once the body is this long
#define CLEAN_ROWS_SHOWN 40       // a table with more rows shows only the rows that are not ok
#define SCRIPT_VALUES_MAX 16000   // characters of inline weights and inputs; more: the script reads the JSON
#define COMMAND_MAX 1500

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

// ----------------------------------------------------------------------------
// text in Markdown

// at most max bytes of s (whole UTF-8 characters, "..." when cut) as Markdown text that shows s and
// nothing else: what could open markup (code, emphasis, a link, raw HTML, a table cell's end) is
// backslash-escaped, a '_' too unless it sits inside a word (fc1_weight); newlines and control
// characters never reach here (gcd_report_safe); runs of blanks (the text table's padding) become one
static int word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

static void cell_max(gcd_sb *b, const char *s, size_t max) {
    size_t n = 0;
    for (const char *p = s; *p; p++, n++) {
        if (n >= max && ((unsigned char)*p & 0xc0) != 0x80) return gcd_sb_printf(b, "...");
        if (*p == ' ' && (p[1] == ' ' || p[1] == 0)) continue;
        if (strchr("\\`*[]<>|~&#!", *p) || (*p == '_' && !(p > s && word_char(p[-1]) && word_char(p[1]))))
            gcd_sb_printf(b, "\\%c", *p);
        else gcd_sb_printf(b, "%c", *p == '\n' || *p == '\r' ? ' ' : *p);
    }
}
// the same inside a code block (a comment of the script): only cut, newlines as blanks
static void code_max(gcd_sb *b, const char *s, size_t max) {
    size_t n = 0;
    for (const char *p = s; *p; p++, n++) {
        if (n >= max && ((unsigned char)*p & 0xc0) != 0x80) return gcd_sb_printf(b, "...");
        gcd_sb_printf(b, "%c", (unsigned char)*p < 0x20 || *p == 0x7f ? ' ' : *p);
    }
}
static void md(gcd_sb *b, const char *s) { cell_max(b, s, 500); }
// at most max bytes of s as a code span: fenced by one backtick more than its longest run of them,
// so that nothing in it can end the span; inside, Markdown and HTML are plain text
static void code_span(gcd_sb *b, const char *s, size_t max) {
    int longest = 0, run = 0;
    for (const char *p = s; *p; p++) run = *p == '`' ? run + 1 : 0, longest = run > longest ? run : longest;
    size_t n = strlen(s);
    int pad = n && (s[0] == '`' || s[n - 1] == '`');
    for (int i = 0; i <= longest; i++) gcd_sb_append(b, "`", 1);
    if (pad) gcd_sb_append(b, " ", 1);
    code_max(b, s, max);
    if (pad) gcd_sb_append(b, " ", 1);
    for (int i = 0; i <= longest; i++) gcd_sb_append(b, "`", 1);
}
static void cell(gcd_sb *b, const char *s) { cell_max(b, s, 500); }

// a code fence longer than any run of backticks in the text, so that nothing in it can close it
static void fence(gcd_sb *b, const char *text, const char *info) {
    int longest = 0, run = 0;
    for (const char *p = text; *p; p++) run = *p == '`' ? run + 1 : 0, longest = run > longest ? run : longest;
    for (int i = 0; i < (longest < 3 ? 3 : longest + 1); i++) gcd_sb_append(b, "`", 1);
    gcd_sb_printf(b, "%s\n", info);
}

static void fenced(gcd_sb *b, const char *text, const char *info) {
    fence(b, text, info);
    gcd_sb_printf(b, "%s%s", text, *text && text[strlen(text) - 1] == '\n' ? "" : "\n");
    fence(b, text, "");
}

// the shortest decimal that reads back as v (Python reads it exactly too)
static void py_num(gcd_sb *b, double v) {
    char buf[32];
    if (!isfinite(v)) return gcd_sb_printf(b, isnan(v) ? "float('nan')" : v > 0 ? "float('inf')" : "-float('inf')");
    gcd_sb_append(b, buf, (size_t)gcd_num_shortest(buf, v));
}

// a Python string literal: quotes, backslashes and control characters escaped, so that no name in a
// report can end the string and put code into the script
static void py_str(gcd_sb *b, const char *s) {
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    gcd_sb_printf(b, "\"");
    while (p < end) {
        size_t k = gcd_utf8_char(p, (size_t)(end - p));
        if (!k) gcd_sb_printf(b, "\\ufffd"), k = 1;   // not UTF-8: not a character Python could name either
        else if (*p == '"' || *p == '\\') gcd_sb_printf(b, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) gcd_sb_printf(b, "\\x%02x", *p);
        else if (gcd_term_needs_char(p, k)) {   // C1, bidi overrides, separators: escaped, never shown raw
            char one[8];
            memcpy(one, p, k), one[k] = 0;
            char *e = gcd_term_str(one);
            gcd_sb_printf(b, "%s", e);
            free(e);
        } else gcd_sb_append(b, p, k);
        p += k;
    }
    gcd_sb_printf(b, "\"");
}

// ----------------------------------------------------------------------------
// the title: the finding in the library's words

// the library's first name for a mode: "Lightning all_gather(sync_grads=False)" of "Lightning
// all_gather(sync_grads=False), also in ...; torchmetrics ..." (cut at ',' ';' or ' =' outside brackets)
static void library(gcd_sb *b, const cJSON *run, int code) {
    const char *s = gcd_jstr(run, "library"), *p = s;
    int depth = 0;
    for (; *p && (depth || !(*p == ',' || *p == ';' || (*p == ' ' && p[1] == '='))); p++) depth += (*p == '(') - (*p == ')');
    if (p == s) {
        char *mode = gcd_term_str(or_dash(gcd_jstr(run, "mode")));
        gcd_sb_printf(b, "gather mode "), (code ? code_max : cell_max)(b, mode, 40);
        free(mode);
        return;
    }
    char *clause = gcd_strdup(s);   // through cell: no newline ends the title or the script's comment
    clause[p - s] = 0;
    char *shown = code ? gcd_term_str(clause) : NULL;   // the script reads the raw report: its comment shows it as a terminal would
    (code ? code_max : cell_max)(b, code ? shown : clause, 160);
    free(shown);
    free(clause);
}

static int starts_with(const char *s, const char *prefix, size_t n) { return !strncmp(s, prefix, n) && s[n] == '.'; }

// a finding's parameters, short: "fc1.weight, fc1.bias"; "visual.*" for three or more that are all of
// the run's parameters under one first name; at most 4 items (from the first 64 names), then "and N more".
// Returns how many items and names more.
static int names(gcd_sb *b, const cJSON *run, const cJSON *list) {
    const cJSON *a, *p, *q, *params = cJSON_GetObjectItemCaseSensitive(run, "params");
    int items = 0, covered = 0, i = 0, n = cJSON_GetArraySize(list), star = 0;
    cJSON_ArrayForEach(a, list) {
        if (items == 4 || i++ == 64) break;
        const char *s = cJSON_IsString(a) ? a->valuestring : "?", *dot = strchr(s, '.');
        size_t k = dot ? (size_t)(dot - s) : 0;
        int seen = 0, in_run = 0, in_list = 0, before = 1;
        cJSON_ArrayForEach(p, params) in_run += dot && starts_with(gcd_jstr(p, "name"), s, k);
        cJSON_ArrayForEach(q, list) {
            int same = dot && cJSON_IsString(q) && starts_with(q->valuestring, s, k);
            before &= q != a;
            in_list += same, seen |= same && before;
        }
        int group = dot && in_list >= 3 && in_list == in_run;
        if (group && seen) continue;   // written already
        if (star) b->len--, gcd_sb_printf(b, "\\*");   // "visual.*, text": a '*' before ',' could open emphasis; before ' ' or the end it cannot
        gcd_sb_printf(b, "%s", items++ ? ", " : "");
        if ((star = group)) {
            char prefix[84];
            snprintf(prefix, sizeof prefix, "%.*s", (int)(k > 80 ? 80 : k), s);
            cell_max(b, prefix, 80);
            gcd_sb_printf(b, ".*");
        }
        else cell_max(b, s, 80);
        covered += group ? in_list : 1;
    }
    if (covered < n) gcd_sb_printf(b, " and %d more", n - covered);
    return items + (n - covered);
}

// "fc1.weight, fc1.bias get no gradient at world 4", from the finding's kind and its first param's numbers
static void finding_words(gcd_sb *b, const cJSON *run, const cJSON *f) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(f, "params"), *p = NULL, *q;
    const char *kind = gcd_jstr(f, "kind"), *first = cJSON_IsString(cJSON_GetArrayItem(list, 0)) ? cJSON_GetArrayItem(list, 0)->valuestring : "";
    int W = gcd_jint(run, "world");
    cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(run, "params")) if (!p && !strcmp(gcd_jstr(q, "name"), first)) p = q;
    static const char *const kinds[] = { "none", "partial", "zero", "nonfinite", "disagree", "scaled", "mismatch" };
    int known = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) known |= !strcmp(kind, kinds[i]);
    if (!known || !cJSON_GetArraySize(list)) return cell_max(b, gcd_jstr(f, "message"), 200);
    gcd_sb who = { 0 };
    int many = names(&who, run, list) > 1;
    gcd_sb_printf(b, "%s %s ", who.s ? who.s : "?", many ? "get" : "gets");
    gcd_sb_free(&who);
    double c = gcd_jnum(p, "scale");
    if (!strcmp(kind, "none")) gcd_sb_printf(b, "no gradient");
    else if (!strcmp(kind, "partial")) gcd_sb_printf(b, "a gradient on only %d of %d ranks", gcd_jint(p, "ranks_with_grad"), W);
    else if (!strcmp(kind, "zero")) gcd_sb_printf(b, "an all-zero gradient");
    else if (!strcmp(kind, "nonfinite")) gcd_sb_printf(b, "NaN or Inf in the gradient");
    else if (!strcmp(kind, "disagree")) {   // with both stages, what the local dumps showed (issue 38)
        const char *sc = gcd_jstr(p, "stage_cause");
        gcd_sb_printf(b, "a different gradient on different ranks%s", !strcmp(sc, "unreduced") ? " (no all-reduce ran)"
                                                                      : !strcmp(sc, "last_unsynced") ? " (the last backward did not sync)"
                                                                      : !strcmp(sc, "part_own") ? " (part averaged, part the rank's own)" : "");
    } else if (!strcmp(kind, "scaled"))
        gcd_sb_printf(b, "x%.4g the gradient%s", c, fabs(c * W - 1) <= 1e-6 ? strstr(gcd_jstr(f, "message"), "a double reduction") ? " (1/world: a double reduction)" : " (1/world)" : "");
    else gcd_sb_printf(b, "a wrong gradient (cosine %.3f to the reference)", gcd_jnum(p, "cosine"));
    gcd_sb_printf(b, " at world %d", W);
}

static int is_check(const cJSON *doc) { return !strcmp(gcd_jstr(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "runs"), 0), "probe"), "check"); }

// the run the ticket is about: the first run under test with a finding, else the first under test
static const cJSON *ticket_run(const cJSON *runs, const cJSON **finding) {
    const cJSON *r, *f, *test = NULL;
    *finding = NULL;
    cJSON_ArrayForEach(r, runs) {
        if (strcmp(gcd_jstr(r, "role"), "test")) continue;
        if (!test) test = r;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(r, "findings")) if (gcd_jbool(f, "counts")) return *finding = f, r;
    }
    return test ? test : cJSON_GetArrayItem(runs, 0);
}

static void title(gcd_sb *b, const cJSON *doc, const cJSON *run, const cJSON *f) {
    const cJSON *e, *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    gcd_sb_printf(b, "# ");
    if (cJSON_IsObject(err)) {
        gcd_sb_printf(b, "gradcheck-dist failed on rank %d: ", gcd_jint(err, "rank"));
        cell_max(b, gcd_jstr(err, "message"), 200);
    } else if (f && is_check(doc)) {
        finding_words(b, run, f);
        gcd_sb_printf(b, " (check of dumps)");
    } else if (f) {
        library(b, run, 0);
        gcd_sb_printf(b, ": ");
        finding_words(b, run, f);
    } else {
        int unmet = 0, n = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "expectations")) {
            n++;
            if (!gcd_jbool(e, "met") && !unmet++) cell_max(b, gcd_jstr(e, "message"), 200);
        }
        if (!unmet && is_check(doc)) gcd_sb_printf(b, "No gradient finding at world %d (check of dumps)", gcd_jint(run, "world"));
        else if (!unmet) {
            gcd_sb_printf(b, "No gradient finding under ");
            library(b, run, 0);
            gcd_sb_printf(b, " at world %d (%d of %d expectations met)", gcd_jint(run, "world"), n, n);
        }
    }
    gcd_sb_printf(b, "\n\n");
}

// ----------------------------------------------------------------------------
// environment

// "vm x4, gpu1 x2": each distinct string once with its count, at most 8, in the order they first
// appear; sorted, not compared pairwise (100k host names)
typedef struct {
    const char *s;
    int at;
} named;

static int by_name(const void *a, const void *b) {
    const named *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}
static int by_first(const void *a, const void *b) { return (((const named *)a)->at > ((const named *)b)->at) - (((const named *)a)->at < ((const named *)b)->at); }

static void distinct(gcd_sb *b, const cJSON *list) {
    int n = cJSON_GetArraySize(list), i = 0, groups = 0;
    if (n <= 0) return;
    named *all = gcd_malloc((size_t)n * sizeof *all), *first = gcd_malloc((size_t)n * sizeof *first);
    int *count = gcd_malloc((size_t)n * sizeof *count);
    const cJSON *h;
    cJSON_ArrayForEach(h, list) all[i] = (named){ cJSON_IsString(h) ? h->valuestring : "?", i }, i++;
    qsort(all, (size_t)n, sizeof *all, by_name);
    for (int k = 0; k < n; k++) {
        if (!k || strcmp(all[k].s, all[k - 1].s)) first[groups] = all[k], count[all[k].at] = 0, groups++;
        count[first[groups - 1].at]++;
    }
    qsort(first, (size_t)groups, sizeof *first, by_first);
    for (int g = 0; g < groups && g < 8; g++) {
        gcd_sb_printf(b, "%s", g ? ", " : "");
        cell_max(b, first[g].s, 80);
        if (count[first[g].at] > 1) gcd_sb_printf(b, " x%d", count[first[g].at]);
    }
    if (groups > 8) gcd_sb_printf(b, " and %d more", groups - 8);
    free(all), free(first), free(count);
}

static void environment(gcd_sb *b, const cJSON *doc) {
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(doc, "environment"), *r0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "runs"), 0);
    gcd_sb_printf(b, "## Environment\n\n- gradcheck-dist "), md(b, or_dash(gcd_jstr(cJSON_GetObjectItemCaseSensitive(doc, "tool"), "version"))), gcd_sb_printf(b, ", ");
    if (is_check(doc)) {
        const cJSON *d, *ref = cJSON_GetObjectItemCaseSensitive(r0, "reference");
        gcd_sb_printf(b, "`check` of %d dumps (stage ", gcd_jint(env, "world")), md(b, or_dash(gcd_jstr(r0, "stage")));
        gcd_sb_printf(b, "), tolerance %g\n- as the dumps recorded: Python ", gcd_jnum(doc, "tolerance")), md(b, or_dash(gcd_jstr(env, "python_version")));
        gcd_sb_printf(b, ", torch "), md(b, or_dash(gcd_jstr(env, "torch_version"))), gcd_sb_printf(b, ", Lightning "), md(b, or_dash(gcd_jstr(env, "lightning_version")));
        gcd_sb_printf(b, "\n");
        gcd_sb_printf(b, "- dumps:");
        int i = 0;
        cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(r0, "dumps")) {
            if (i++ >= 4) continue;
            gcd_sb_printf(b, " ");
            code_span(b, gcd_jstr(d, "path"), 120);
        }
        gcd_sb_printf(b, "%s; reference: ", i > 4 ? " ..." : "");
        if (cJSON_IsObject(ref)) code_span(b, gcd_jstr(ref, "path"), 120), gcd_sb_printf(b, "\n");
        else gcd_sb_printf(b, "none\n");
    } else {
        gcd_sb_printf(b, "backend "), md(b, or_dash(gcd_jstr(env, "backend"))), gcd_sb_printf(b, ", world %d, ", gcd_jint(env, "world"));
        md(b, or_dash(gcd_jstr(env, "precision"))), gcd_sb_printf(b, ", tolerance %g\n- MPI: ", gcd_jnum(doc, "tolerance"));
        cell_max(b, or_dash(gcd_jstr(env, "mpi_version")), 200);
        if (*gcd_jstr(env, "nccl_version") || *gcd_jstr(env, "cuda_version"))
            gcd_sb_printf(b, "\n- NCCL "), md(b, or_dash(gcd_jstr(env, "nccl_version"))), gcd_sb_printf(b, ", CUDA "), md(b, or_dash(gcd_jstr(env, "cuda_version")));
        gcd_sb_printf(b, "\n- hosts: ");
        distinct(b, cJSON_GetObjectItemCaseSensitive(env, "hostnames"));
        if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(env, "devices"))) {
            gcd_sb_printf(b, "; devices: ");
            distinct(b, cJSON_GetObjectItemCaseSensitive(env, "devices"));
        }
        gcd_sb_printf(b, "\n");
    }
    gcd_sb_printf(b, "- started "), md(b, or_dash(gcd_jstr(env, "start_time"))), gcd_sb_printf(b, "\n\n");
}

// ----------------------------------------------------------------------------
// findings and tables

static void findings(gcd_sb *b, const cJSON *doc) {
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs"), *run, *f, *e;
    int shown = 0, left = 0;
    gcd_sb_printf(b, "## Findings\n\n");
    for (int test = 1; test >= 0; test--) {   // the configuration under test first, then the controls
        cJSON_ArrayForEach(run, runs) {
            if ((strcmp(gcd_jstr(run, "role"), "test") == 0) != test) continue;
            cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(run, "findings")) {
                if (!gcd_jbool(f, "counts")) continue;
                if (b->len > FINDINGS_UNTIL) { left++; continue; }
                char t[160];
                gcd_sb_printf(b, "- **"), md(b, gcd_run_title(run, t, sizeof t));   // a check's title names its stage
                if (!is_check(doc)) gcd_sb_printf(b, ", mode "), md(b, gcd_jstr(run, "mode"));
                gcd_sb_printf(b, "** (%s", test ? "under test" : "control");
                if (*gcd_jstr(run, "library")) gcd_sb_printf(b, ": "), library(b, run, 0);
                gcd_sb_printf(b, "): ");
                cell(b, gcd_jstr(f, "message"));
                const cJSON *p = gcd_finding_param(run, f);
                gcd_sb chain = { 0 };
                if (p && gcd_chain(&chain, p)) gcd_sb_printf(b, "\n  - path: "), code_span(b, chain.s, 400);
                gcd_sb_free(&chain);
                gcd_sb_printf(b, "\n");
                shown++;
            }
        }
    }
    if (left) gcd_sb_printf(b, "- ... and %d more findings in the JSON report\n", left);
    if (!shown && !left) gcd_sb_printf(b, "None: every gradient matches the reference.\n");
    int met = 0, n = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "expectations")) {
        n++;
        if (gcd_jbool(e, "met")) met++;
        else if (b->len <= FINDINGS_UNTIL && strcmp(gcd_jstr(e, "role"), "test"))   // a test's are its findings, above
            gcd_sb_printf(b, "- **control not caught:** "), cell(b, gcd_jstr(e, "message")), gcd_sb_printf(b, "\n");
    }
    gcd_sb_printf(b, "\n**Result: "), md(b, or_dash(gcd_jstr(doc, "result")));
    if (is_check(doc))   // a check has no controls: its result is its findings
        gcd_sb_printf(b, "** (exit %d).\n\n", gcd_jint(doc, "exit_code"));
    else
        gcd_sb_printf(b, "** (exit %d); %d of %d expectations met (the configuration under test shows no finding, each control its known defect).\n\n",
                      gcd_jint(doc, "exit_code"), met, n);
}

static int clean(const char *status) { return !strcmp(status, "ok") || !strcmp(status, "present"); }

static void tables(gcd_sb *b, const cJSON *runs) {
    gcd_sb_printf(b, "## Gradients\n\nCell: status, L2 norm of the DDP-mean gradient, and its scale (xC) or cosine against the reference.\n\n");
    int group[MAX_RUNS], ng = gcd_run_groups(runs, group, MAX_RUNS), nruns = cJSON_GetArraySize(runs), hidden = 0;
    if (nruns > MAX_RUNS) gcd_sb_printf(b, "(%d more runs are in the JSON report; the tables show the first %d)\n\n", nruns - MAX_RUNS, MAX_RUNS);
    for (int g = 0; g < ng; g++) {
        const cJSON *cols[8] = { 0 }, *cur[8] = { 0 };
        int ncol = gcd_group_runs(runs, group, g, cols, 8), rows = 0, all_rows;
        char t[160], c[64], shp[96];
        gcd_rows_begin(cur, cols, ncol);
        for (; cur[0]; gcd_rows_next(cur, ncol)) rows++;
        all_rows = rows <= CLEAN_ROWS_SHOWN;
        gcd_sb_printf(b, "### "), md(b, gcd_run_title(cols[0], t, sizeof t)), gcd_sb_printf(b, "\n\n| parameter | shape |");
        for (int k = 0; k < ncol; k++)
            if (!strcmp(gcd_jstr(cols[k], "probe"), "check")) gcd_sb_printf(b, " stage "), md(b, gcd_jstr(cols[k], "mode")), gcd_sb_printf(b, " |");
            else gcd_sb_printf(b, " "), md(b, gcd_jstr(cols[k], "mode")), gcd_sb_printf(b, " ("), md(b, gcd_jstr(cols[k], "role")), gcd_sb_printf(b, ") |");
        gcd_sb_printf(b, "\n|---|---|");
        for (int k = 0; k < ncol; k++) gcd_sb_printf(b, "---|");
        gcd_sb_printf(b, "\n");
        gcd_rows_begin(cur, cols, ncol);
        for (; cur[0]; gcd_rows_next(cur, ncol)) {
            int dirty = 0;
            for (int k = 0; k < ncol; k++) dirty |= !cur[k] || !clean(gcd_jstr(cur[k], "status"));
            if ((!all_rows && !dirty) || b->len > TABLES_UNTIL) { hidden++; continue; }
            gcd_sb_printf(b, "| ");
            cell_max(b, gcd_jstr(cur[0], "name"), 120);
            gcd_sb_printf(b, " | %s |", gcd_jshape(cur[0], shp, sizeof shp));
            for (int k = 0; k < ncol; k++) gcd_sb_printf(b, " "), cell(b, cur[k] ? gcd_cell(cur[k], c, sizeof c) : "?"), gcd_sb_printf(b, " |");
            gcd_sb_printf(b, "\n");
        }
        gcd_sb_printf(b, "\n");
    }
    if (hidden) gcd_sb_printf(b, "(%d more rows, all in the JSON report: only rows with a finding are shown when a table is long)\n\n", hidden);
}

// ----------------------------------------------------------------------------
// reproduce: the command, and a PyTorch script

static void command(gcd_sb *b, const cJSON *doc) {
    const cJSON *a;
    int i = 0;
    gcd_sb line = { 0 };
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(doc, "command")) {
        const char *s = cJSON_IsString(a) ? a->valuestring : "";
        if (line.len > COMMAND_MAX) { gcd_sb_printf(&line, " ...   (%d arguments in all, in the JSON report's \"command\")", cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "command"))); break; }
        if (i++ == 0) s = "gradcheck-dist";   // argv[0] was this machine's path
        gcd_sb_printf(&line, "%s", i > 1 ? " " : "");
        if (s[strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+-")] || !*s) {   // quoted: '...', a quote as '\'', a newline as $'\n'
            gcd_sb_printf(&line, "'");
            for (; *s && line.len < COMMAND_MAX + 400; s++) {
                if (*s == '\'') gcd_sb_printf(&line, "'\\''");
                else if (*s == '\n' || *s == '\r') gcd_sb_printf(&line, "'$'\\%c''", *s == '\n' ? 'n' : 'r');
                else gcd_sb_printf(&line, "%c", *s);
            }
            gcd_sb_printf(&line, "'");
        } else {
            gcd_sb_printf(&line, "%.400s", s);
        }
    }
    fenced(b, line.s ? line.s : "", "sh");
    gcd_sb_printf(b, "\n");
    gcd_sb_free(&line);
}

// the numbers of a tensor as a Python list; 0 when it holds no plain array of them (null: --summary-only,
// an object: elided) or more than max characters
static int py_list(gcd_sb *b, const cJSON *v, size_t max) {
    const cJSON *x;
    size_t start = b->len;
    if (!cJSON_IsArray(v)) return 0;
    gcd_sb_printf(b, "[");
    cJSON_ArrayForEach(x, v) {
        if (b->len - start > max || !(cJSON_IsNumber(x) || cJSON_IsString(x))) return 0;
        gcd_sb_printf(b, "%s", x == v->child ? "" : ", ");
        py_num(b, gcd_json_num(x));
    }
    gcd_sb_printf(b, "]");
    return 1;
}

static void py_shape(gcd_sb *b, const cJSON *o) {
    char shp[96];
    gcd_jshape(o, shp, sizeof shp);
    gcd_sb_printf(b, "[%.*s]", strlen(shp) > 2 ? (int)strlen(shp) - 2 : 0, shp + 1);
}

// PARAMS and INPUTS inline from the setup; 0 (and nothing) when a value is absent, elided or too long
static int py_values(gcd_sb *out, const cJSON *setup) {
    gcd_sb b = { 0 };
    const cJSON *p, *r, *t;
    int ok = cJSON_IsObject(setup);
    gcd_sb_printf(&b, "PARAMS = {  # name: (shape, initial values)\n");
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(setup, "params")) {
        if (!ok) break;
        gcd_sb_printf(&b, "    ");
        py_str(&b, gcd_jstr(p, "name"));
        gcd_sb_printf(&b, ": (");
        py_shape(&b, p);
        gcd_sb_printf(&b, ", ");
        ok = py_list(&b, cJSON_GetObjectItemCaseSensitive(p, "init"), SCRIPT_VALUES_MAX) && b.len < SCRIPT_VALUES_MAX;
        gcd_sb_printf(&b, "),\n");
    }
    gcd_sb_printf(&b, "}\nINPUTS = [  # rank r's inputs: name: (shape, values)\n");
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(setup, "inputs")) {
        gcd_sb_printf(&b, "    {");
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(r, "tensors")) {
            if (!ok) break;
            gcd_sb_printf(&b, "%s", t == cJSON_GetObjectItemCaseSensitive(r, "tensors")->child ? "" : ", ");
            py_str(&b, gcd_jstr(t, "name"));
            gcd_sb_printf(&b, ": (");
            py_shape(&b, t);
            gcd_sb_printf(&b, ", ");
            ok = py_list(&b, cJSON_GetObjectItemCaseSensitive(t, "data"), SCRIPT_VALUES_MAX) && b.len < SCRIPT_VALUES_MAX;
            gcd_sb_printf(&b, ")");
        }
        gcd_sb_printf(&b, "},\n");
    }
    gcd_sb_printf(&b, "]\n");
    if (ok) gcd_sb_printf(out, "%s", b.s);
    gcd_sb_free(&b);
    return ok;
}

static const char py_load[] =
    "\n\ndef load(path):  # this run's setup from the JSON report (written with --full when it is large)\n"
    "    global PARAMS, INPUTS\n"
    "    doc = json.load(open(path))\n"
    "    run = next(r for r in doc[\"runs\"] if (r[\"probe\"], r[\"mode\"], r[\"local_loss\"]) == (PROBE, MODE, LOCAL_LOSS))\n"
    "    setup = run.get(\"setup\") or next(s for s in doc[\"setups\"] if s[\"probe\"] == PROBE)\n"
    "    PARAMS = {p[\"name\"]: (p[\"shape\"], p[\"init\"]) for p in setup[\"params\"]}\n"
    "    INPUTS = [{t[\"name\"]: (t[\"shape\"], t[\"data\"]) for t in r[\"tensors\"]} for r in setup[\"inputs\"]]\n"
    "    for name, (shape, values) in list(PARAMS.items()) + [kv for r in INPUTS for kv in r.items()]:\n"
    "        if not isinstance(values, list):\n"
    "            sys.exit(f\"{path}: {name} has no values in this report (elided or --summary-only): rerun gradcheck-dist with --full\")\n\n\n"
    "if len(sys.argv) > 1:  # here, not under __main__: the spawned workers import this file again\n"
    "    load(sys.argv[1])\n"
    "elif PARAMS is None:\n"
    "    sys.exit(\"usage: python repro.py REPORT.json   (the JSON report gradcheck-dist wrote, with --full)\")\n";

static const char py_lightning[] =
    "try:  # what LightningModule.all_gather -> DDPStrategy.all_gather calls (pytorch-lightning 2.x)\n"
    "    from lightning_fabric.utilities.distributed import _all_gather_ddp_if_available\n"
    "except ImportError:\n"
    "    from lightning.fabric.utilities.distributed import _all_gather_ddp_if_available\n\n\n"
    "def lightning_all_gather(x, sync_grads):  # (W, B, ...) -> (W*B, ...)\n"
    "    return _all_gather_ddp_if_available(x, sync_grads=sync_grads).flatten(0, 1)\n";

static const char *const py_gather[] = {
    // off
    "\n\ndef gather(x):  # Lightning all_gather(sync_grads=False): under no_grad, no graph back to x\n"
    "    return lightning_all_gather(x, sync_grads=False)\n",
    // on
    "\n\ndef gather(x):  # Lightning all_gather(sync_grads=True) = torch.distributed.nn.functional.all_gather\n"
    "    return lightning_all_gather(x, sync_grads=True)\n",
    // local
    "from torchmetrics.utilities.distributed import gather_all_tensors\n\n\n"
    "def gather(x):  # open_clip gather_features(gather_with_grad=False): everyone's rows without a graph, the own slot put back\n"
    "    out = gather_all_tensors(x)  # torchmetrics: W tensors, no graph (>= 1.6 puts the own slot back itself)\n"
    "    out[dist.get_rank()] = x\n"
    "    return torch.cat(out)\n",
    // avg
    "\n\nclass HorovodAllgather(torch.autograd.Function):  # horovod.torch.allgather's backward, re-implemented on gloo\n"
    "    @staticmethod\n"
    "    def forward(ctx, x):\n"
    "        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
    "        dist.all_gather(out, x.contiguous())\n"
    "        return torch.cat(out)\n\n"
    "    @staticmethod\n"
    "    def backward(ctx, g):  # all_reduce(Average), then this rank's rows\n"
    "        g = g.contiguous().clone()\n"
    "        dist.all_reduce(g)\n"
    "        return (g / dist.get_world_size()).chunk(dist.get_world_size())[dist.get_rank()]\n\n\n"
    "def gather(x):  # Horovod allgather\n"
    "    return HorovodAllgather.apply(x)\n",
};

static const char py_simplenet[] =
    "\n\nclass Model(torch.nn.Module):  # gradcheck-dist's simplenet\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc1, self.fc2 = torch.nn.Linear(2, 2).double(), torch.nn.Linear(2, 2).double()\n\n"
    "    def features(self, inp):\n"
    "        return F.relu(self.fc1(inp[\"input1\"])), F.relu(self.fc2(inp[\"input2\"]))\n\n"
    "    def loss(self, x_all, y_all, x, y, rank):  # x_all, y_all: every rank's rows, gathered\n"
    "        k = x_all.view(-1) * y_all.view(-1)\n"
    "        return F.mse_loss(k, torch.zeros_like(k))\n\n"
    "    def forward(self, inp, rank):  # x with the library's gather under test, y with gradients\n"
    "        x, y = self.features(inp)\n"
    "        return self.loss(gather(x), lightning_all_gather(y, sync_grads=True), x, y, rank)\n";

static const char py_contrastive[] =
    "\n\nclass Model(torch.nn.Module):  # gradcheck-dist's contrastive probe: a CLIP-like toy\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        (E, DI), (_, DT) = PARAMS[\"img.weight\"][0], PARAMS[\"txt.weight\"][0]\n"
    "        self.img, self.txt = torch.nn.Linear(DI, E).double(), torch.nn.Linear(DT, E).double()\n"
    "        self.logit_scale = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))\n\n"
    "    def features(self, inp):\n"
    "        return F.normalize(self.img(inp[\"x_img\"]), dim=-1), F.normalize(self.txt(inp[\"x_txt\"]), dim=-1)\n\n"
    "    def loss(self, I_all, T_all, I, T, rank):  # I_all, T_all: every rank's rows, gathered\n"
    "        s, B = self.logit_scale.exp(), I.shape[0]\n"
    "        if LOCAL_LOSS:  # open_clip local_loss=True: this rank's rows against everyone's\n"
    "            labels = torch.arange(B) + rank * B\n"
    "            return (F.cross_entropy(s * I @ T_all.T, labels) + F.cross_entropy(s * T @ I_all.T, labels)) / 2\n"
    "        logits, labels = s * I_all @ T_all.T, torch.arange(I_all.shape[0])\n"
    "        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2\n\n"
    "    def forward(self, inp, rank):\n"
    "        I, T = self.features(inp)\n"
    "        return self.loss(gather(I), gather(T), I, T, rank)\n";

static const char py_main[] =
    "\n\ndef tensor(shape, values):\n"
    "    return torch.tensor(values, dtype=torch.float64).reshape(shape)\n\n\n"
    "def model():\n"
    "    m = Model()\n"
    "    with torch.no_grad():\n"
    "        for name, p in m.named_parameters():\n"
    "            p.copy_(tensor(*PARAMS[name]))\n"
    "    return m\n\n\n"
    "def inputs(rank):\n"
    "    return {name: tensor(*v) for name, v in INPUTS[rank].items()}\n\n\n"
    "def norms(m):\n"
    "    return {n: None if p.grad is None else p.grad.norm().item() for n, p in m.named_parameters()}\n\n\n"
    "def single_process():  # one process, every rank's rows, the gather a plain torch.cat: the mean of the rank losses\n"
    "    m = model()\n"
    "    feats = [m.features(inputs(r)) for r in range(WORLD)]\n"
    "    every = [torch.cat([f[i] for f in feats]) for i in range(2)]\n"
    "    (sum(m.loss(*every, *feats[r], r) for r in range(WORLD)) / WORLD).backward()\n"
    "    return norms(m)\n\n\n"
    "def worker(rank, init_file, expected):\n"
    "    dist.init_process_group(\"gloo\", init_method=\"file://\" + init_file, rank=rank, world_size=WORLD)\n"
    "    m = model()\n"
    "    ddp = torch.nn.parallel.DistributedDataParallel(m, find_unused_parameters=True)\n"
    "    ddp(inputs(rank), rank).backward()\n"
    "    if rank == 0:\n"
    "        print(f\"{'parameter':16} {'DDP gradient norm':>24} {'single-process norm':>24}\")\n"
    "        got = norms(m)\n"
    "        for name in PARAMS:\n"
    "            print(f\"{name:16} {got[name]!r:>24} {expected[name]!r:>24}\")\n"
    "    dist.barrier()\n"
    "    dist.destroy_process_group()\n"
    "    sys.stdout.flush()\n"
    "    os._exit(0)  # past gloo's destructor, which can hang at exit in torch 1.13\n\n\n"
    "if __name__ == \"__main__\":\n"
    "    with tempfile.TemporaryDirectory() as d:\n"
    "        mp.spawn(worker, args=(os.path.join(d, \"init\"), single_process()), nprocs=WORLD)\n";

// a script for the run: W gloo processes, real DDP, the library's gather; prints every parameter's
// gradient norm (None when it has none) next to the single-process one
static void script(gcd_sb *b, const cJSON *doc, const cJSON *run) {
    const char *probe = gcd_jstr(run, "probe"), *mode = gcd_jstr(run, "mode");
    int m = !strcmp(mode, "off") ? 0 : !strcmp(mode, "on") ? 1 : !strcmp(mode, "local") ? 2 : !strcmp(mode, "avg") ? 3 : -1;
    int simple = !strcmp(probe, "simplenet");
    if (m < 0 || (!simple && strcmp(probe, "contrastive"))) return;
    gcd_sb s = { 0 }, values = { 0 };
    int inline_values = py_values(&values, gcd_report_run_setup(doc, run));
    gcd_sb_printf(&s, "# Reproduces gradcheck-dist's %s, mode %s (", probe, mode);
    library(&s, run, 1);
    gcd_sb_printf(&s, ") at world %d with real DDP on gloo.\n# Prints each parameter's DDP gradient norm (None: no gradient) next to the single-process one.\n", gcd_jint(run, "world"));
    gcd_sb_printf(&s, "# usage: python repro.py%s   (torch 1.13+, pytorch-lightning%s)\n", inline_values ? " [REPORT.json]" : " REPORT.json", m == 2 ? ", torchmetrics" : "");
    gcd_sb_printf(&s, "import json\nimport os\nimport sys\nimport tempfile\n\nimport torch\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\nimport torch.nn.functional as F\n\n");
    gcd_sb_printf(&s, "PROBE, MODE, WORLD, LOCAL_LOSS = \"%s\", \"%s\", %d, %s\n", probe, mode, gcd_jint(run, "world"), gcd_jbool(run, "local_loss") ? "True" : "False");
    if (inline_values) gcd_sb_printf(&s, "%s", values.s);
    else gcd_sb_printf(&s, "PARAMS, INPUTS = None, None  # too large for a ticket: read from the JSON report, see load()\n");
    gcd_sb_printf(&s, "%s", py_load);
    if (simple || m < 2) gcd_sb_printf(&s, "\n\n%s", py_lightning);
    gcd_sb_printf(&s, "%s%s%s", py_gather[m], simple ? py_simplenet : py_contrastive, py_main);
    gcd_sb_printf(b, "### PyTorch script\n\n");
    if (inline_values) gcd_sb_printf(b, "The probe's weights and every rank's inputs are inline; the gather is the library's own function.\n\n");
    else gcd_sb_printf(b, "The weights and inputs are too large for a ticket: **attach the JSON report** (rerun the command above with `--full` if its tensors say `elided`, without `--summary-only`) and run `python repro.py REPORT.json`.\n\n");
    gcd_sb_printf(b, "<details><summary>repro.py</summary>\n\n");
    fenced(b, s.s, "python");
    gcd_sb_printf(b, "\n</details>\n");
    gcd_sb_free(&s), gcd_sb_free(&values);
}

static const char harness[] =
    "# pip install .   (in the gradcheck-dist source tree: gradcheck_dist and the gradcheck-dist program)\n"
    "# on every rank, one step, after loss.backward():\n"
    "from gradcheck_dist import dump_grads\n"
    "dump_grads(ddp_model, f\"grads/rank{torch.distributed.get_rank()}.safetensors\")\n"
    "# reference: one process, no process group, the same starting weights, the whole global batch:\n"
    "dump_grads(model, \"ref.safetensors\")\n"
    "# Lightning: Trainer(devices=N, callbacks=[gradcheck_dist.GradcheckDump(\"grads\")])\n"
    "# then: gradcheck-dist check grads --ref ref.safetensors\n";

static char *render_md(const cJSON *doc, const cJSON *raw) {
    gcd_sb b = { 0 };
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs"), *f, *run = ticket_run(runs, &f);
    title(&b, doc, run, f);
    environment(&b, doc);
    findings(&b, doc);
    tables(&b, runs);
    gcd_sb_printf(&b, "## Reproduce\n\n");
    command(&b, doc);
    if (is_check(doc)) {
        gcd_sb_printf(&b, "The dumps came from the user's training, written with the Python harness:\n\n");
        fenced(&b, harness, "python");
    } else if (run) {
        const cJSON *raw_f;   // the script's names as they are (Python string literals escape them), not as shown
        script(&b, raw, ticket_run(cJSON_GetObjectItemCaseSensitive(raw, "runs"), &raw_f));
    }
    gcd_sb_printf(&b, "\nThe JSON report holds every value (tensors over 4096 elements with `--full`): attach it to the ticket.\n");
    return b.s;
}

// the strings without controls or newlines first (gcd_report_safe), then escaped for Markdown where they go
char *gcd_render_md(const cJSON *doc) {
    cJSON *copy;
    char *text = render_md(gcd_report_safe(doc, &copy), doc);
    cJSON_Delete(copy);
    return text;
}
