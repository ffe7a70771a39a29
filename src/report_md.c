#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "report_render.h"

#define MAX_RUNS 64

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

// "|" would end a Markdown table cell and a newline the cell or list item; runs of blanks (the text
// table's padding) become one
static void cell(gcd_sb *b, const char *s) {
    for (const char *p = s; *p; p++) {
        if (*p == ' ' && (p[1] == ' ' || p[1] == 0)) continue;
        if (*p == '|') gcd_sb_printf(b, "\\|");
        else gcd_sb_printf(b, "%c", *p == '\n' || *p == '\r' ? ' ' : *p);
    }
}

// a code fence longer than any run of backticks in the text, so that nothing in it can close it
static void fence(gcd_sb *b, const char *text, const char *info) {
    int longest = 0, run = 0;
    for (const char *p = text; *p; p++) run = *p == '`' ? run + 1 : 0, longest = run > longest ? run : longest;
    for (int i = 0; i < (longest < 3 ? 3 : longest + 1); i++) gcd_sb_append(b, "`", 1);
    gcd_sb_printf(b, "%s\n", info);
}

// the first thing a reader should know: the first unmet expectation, or that all is well
static void title(gcd_sb *b, const cJSON *doc) {
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "expectations")) {
        if (!gcd_jbool(e, "met")) {
            gcd_sb_printf(b, "# gradcheck-dist: ");
            cell(b, gcd_jstr(e, "message"));
            return gcd_sb_printf(b, "\n\n");
        }
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    if (cJSON_IsObject(err)) return gcd_sb_printf(b, "# gradcheck-dist: run failed on rank %d: %s\n\n", gcd_jint(err, "rank"), gcd_jstr(err, "message"));
    gcd_sb_printf(b, "# gradcheck-dist: no unexpected gradient finding\n\n");
}

static void command(gcd_sb *b, const cJSON *doc) {
    const cJSON *a;
    int i = 0;
    gcd_sb line = { 0 };
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(doc, "command")) {
        const char *s = cJSON_IsString(a) ? a->valuestring : "";
        if (i++ == 0) s = "gradcheck-dist";   // argv[0] was this machine's path
        gcd_sb_printf(&line, "%s", i > 1 ? " " : "");
        if (strpbrk(s, " \t\n\r'\"$`\\|&;<>()*?#~") || !*s) {   // quoted: '...', a quote as '\'', a newline as $'\n'
            gcd_sb_printf(&line, "'");
            for (; *s; s++) {
                if (*s == '\'') gcd_sb_printf(&line, "'\\''");
                else if (*s == '\n' || *s == '\r') gcd_sb_printf(&line, "'$'\\%c''", *s == '\n' ? 'n' : 'r');
                else gcd_sb_printf(&line, "%c", *s);
            }
            gcd_sb_printf(&line, "'");
        } else {
            gcd_sb_printf(&line, "%s", s);
        }
    }
    const char *text = line.s ? line.s : "";
    fence(b, text, "sh");
    gcd_sb_printf(b, "%s\n", text);
    fence(b, text, "");
    gcd_sb_printf(b, "\n");
    gcd_sb_free(&line);
}

char *gcd_render_md(const cJSON *doc) {
    gcd_sb b = { 0 };
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(doc, "environment"), *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs");
    title(&b, doc);
    gcd_sb_printf(&b, "**Result: %s** (exit %d)\n\n## Environment\n\n| | |\n|---|---|\n", gcd_jstr(doc, "result"), gcd_jint(doc, "exit_code"));
    gcd_sb_printf(&b, "| tool | gradcheck-dist %s |\n", gcd_jstr(cJSON_GetObjectItemCaseSensitive(doc, "tool"), "version"));
    const cJSON *r0 = cJSON_GetArrayItem(runs, 0);
    if (!strcmp(gcd_jstr(r0, "probe"), "check")) {   // the user's dumps: where they came from
        const cJSON *d, *ref = cJSON_GetObjectItemCaseSensitive(r0, "reference");
        gcd_sb_printf(&b, "| dumps | %d, stage %s:", gcd_jint(env, "world"), gcd_jstr(r0, "stage"));
        int i = 0;
        cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(r0, "dumps")) {
            if (i++ < 4) gcd_sb_printf(&b, " `%s`", gcd_jstr(d, "path"));
        }
        gcd_sb_printf(&b, "%s |\n| reference | %s%s%s |\n", i > 4 ? " ..." : "", cJSON_IsObject(ref) ? "`" : "",
                      cJSON_IsObject(ref) ? gcd_jstr(ref, "path") : "none", cJSON_IsObject(ref) ? "`" : "");
        gcd_sb_printf(&b, "| python, torch, lightning | %s, %s, %s |\n", or_dash(gcd_jstr(env, "python_version")),
                      or_dash(gcd_jstr(env, "torch_version")), or_dash(gcd_jstr(env, "lightning_version")));
        gcd_sb_printf(&b, "| tolerance | %g (relative) |\n| started | %s |\n\n", gcd_jnum(doc, "tolerance"), gcd_jstr(env, "start_time"));
    } else {
        gcd_sb_printf(&b, "| backend | %s |\n| world | %d |\n", gcd_jstr(env, "backend"), gcd_jint(env, "world"));
        gcd_sb_printf(&b, "| hosts |");
        const cJSON *h;
        int i = 0;
        cJSON_ArrayForEach(h, cJSON_GetObjectItemCaseSensitive(env, "hostnames")) gcd_sb_printf(&b, "%s%s", i++ ? ", " : " ", cJSON_IsString(h) ? h->valuestring : "?");
        gcd_sb_printf(&b, " |\n| devices |");
        i = 0;
        cJSON_ArrayForEach(h, cJSON_GetObjectItemCaseSensitive(env, "devices")) gcd_sb_printf(&b, "%s%s", i++ ? ", " : " ", cJSON_IsString(h) ? h->valuestring : "?");
        gcd_sb_printf(&b, "%s |\n", i ? "" : " -");
        gcd_sb_printf(&b, "| MPI | %s |\n| NCCL | %s |\n| CUDA | %s |\n", or_dash(gcd_jstr(env, "mpi_version")), or_dash(gcd_jstr(env, "nccl_version")),
                      or_dash(gcd_jstr(env, "cuda_version")));
        gcd_sb_printf(&b, "| precision, tolerance | %s, %g |\n| started | %s |\n| wall (ranks, after launch) | %.3g s |\n\n", gcd_jstr(env, "precision"),
                      gcd_jnum(doc, "tolerance"), gcd_jstr(env, "start_time"), gcd_jnum(env, "wall_seconds"));
    }

    gcd_sb_printf(&b, "## Findings\n\n");
    const cJSON *run, *f;
    int nf = 0;
    cJSON_ArrayForEach(run, runs) {
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(run, "findings")) {
            if (!gcd_jbool(f, "counts")) continue;
            char t[160];
            gcd_sb_printf(&b, "- **%s, mode %s** (%s): ", gcd_run_title(run, t, sizeof t), gcd_jstr(run, "mode"), gcd_jstr(run, "role"));
            cell(&b, gcd_jstr(f, "message"));
            gcd_sb_printf(&b, "\n");
            const cJSON *p = gcd_finding_param(run, f);
            gcd_sb chain = { 0 };
            if (p && gcd_chain(&chain, p)) gcd_sb_printf(&b, "  - path: `%s`\n", chain.s);
            gcd_sb_free(&chain);
            nf++;
        }
    }
    if (!nf) gcd_sb_printf(&b, "None: every gradient matches the single-process reference.\n");
    gcd_sb_printf(&b, "\n## Expectations\n\n");
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "expectations")) {
        gcd_sb_printf(&b, "- %s ", gcd_jbool(e, "met") ? "ok:" : "**FAILED:**");
        cell(&b, gcd_jstr(e, "message"));
        gcd_sb_printf(&b, "\n");
    }

    gcd_sb_printf(&b, "\n## Gradients per parameter and gather mode\n\nCell: status, L2 norm of the DDP-mean gradient, and its scale (xC) or cosine against the single-process reference.\n\n");
    int group[MAX_RUNS], ng = gcd_run_groups(runs, group, MAX_RUNS), nruns = cJSON_GetArraySize(runs);
    if (nruns > MAX_RUNS) gcd_sb_printf(&b, "(%d more runs are in the report; the tables show the first %d)\n\n", nruns - MAX_RUNS, MAX_RUNS);
    for (int g = 0; g < ng; g++) {
        const cJSON *cols[MAX_RUNS] = { 0 };
        int ncol = gcd_group_runs(runs, group, g, cols, MAX_RUNS);
        char t[160], c[64], shp[96];
        gcd_sb_printf(&b, "### %s\n\n| parameter | shape |", gcd_run_title(cols[0], t, sizeof t));
        for (int k = 0; k < ncol; k++) gcd_sb_printf(&b, " %s (%s) |", gcd_jstr(cols[k], "mode"), gcd_jstr(cols[k], "role"));
        gcd_sb_printf(&b, "\n|---|---|");
        for (int k = 0; k < ncol; k++) gcd_sb_printf(&b, "---|");
        gcd_sb_printf(&b, "\n");
        const cJSON *cur[MAX_RUNS] = { 0 };
        gcd_rows_begin(cur, cols, ncol);
        for (; cur[0]; gcd_rows_next(cur, ncol)) {
            gcd_sb_printf(&b, "| %s | %s |", gcd_jstr(cur[0], "name"), gcd_jshape(cur[0], shp, sizeof shp));
            for (int k = 0; k < ncol; k++) {
                gcd_sb_printf(&b, " ");
                cell(&b, cur[k] ? gcd_cell(cur[k], c, sizeof c) : "?");
                gcd_sb_printf(&b, " |");
            }
            gcd_sb_printf(&b, "\n");
        }
        gcd_sb_printf(&b, "\n");
    }
    gcd_sb_printf(&b, "## Reproduce\n\n");
    command(&b, doc);
    char *json = gcd_json_print(doc);
    if (json && strlen(json) > 40000)   // a ticket body holds 65536 characters: the report goes as an attachment
        gcd_sb_printf(&b, "<details><summary>Full JSON report</summary>\n\nThe JSON report is %zu bytes, too long for a ticket: attach the file.\n\n</details>\n", strlen(json));
    else {
        const char *text = json ? json : "(out of memory)";
        gcd_sb_printf(&b, "<details><summary>Full JSON report</summary>\n\n");
        fence(&b, text, "json");
        gcd_sb_printf(&b, "%s\n", text);
        fence(&b, text, "");
        gcd_sb_printf(&b, "\n</details>\n");
    }
    free(json);
    return b.s;
}
