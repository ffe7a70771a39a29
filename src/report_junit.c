#include <stdio.h>
#include <string.h>

#include "report.h"
#include "report_render.h"

#define MAX_RUNS 64

static void xml(gcd_sb *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': gcd_sb_printf(b, "&amp;"); break;
        case '<': gcd_sb_printf(b, "&lt;"); break;
        case '>': gcd_sb_printf(b, "&gt;"); break;
        case '"': gcd_sb_printf(b, "&quot;"); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\n' || *s == '\t') gcd_sb_printf(b, "%c", *s);
        }
    }
}

// One testcase per run. A run under test fails when it has findings; a control fails when it did
// not behave as a control should, and is reported as skipped (with why) when it did.
char *gcd_render_junit(const cJSON *doc) {
    gcd_sb b = { 0 };
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs"), *exps = cJSON_GetObjectItemCaseSensitive(doc, "expectations");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    int n = cJSON_GetArraySize(runs), failures = 0, skipped = 0, errors = cJSON_IsObject(err);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(exps, i);
        failures += !gcd_jbool(e, "met");
        skipped += gcd_jbool(e, "met") && !strcmp(gcd_jstr(e, "role"), "control");
    }
    double wall = gcd_jnum(cJSON_GetObjectItemCaseSensitive(doc, "environment"), "wall_seconds");
    gcd_sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    gcd_sb_printf(&b, "<testsuites name=\"gradcheck-dist\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.3f\">\n",
                  n + errors, failures, errors, skipped, wall == wall ? wall : 0.0);
    int group[MAX_RUNS], ng = gcd_run_groups(runs, group, MAX_RUNS);
    for (int g = 0; g < ng; g++) {
        const cJSON *run;
        int i = 0, first = 1;
        cJSON_ArrayForEach(run, runs) {
            if (i >= MAX_RUNS || group[i] != g) { i++; continue; }
            const cJSON *e = cJSON_GetArrayItem(exps, i++);
            char t[160];
            if (first) {
                first = 0;
                gcd_sb_printf(&b, "  <testsuite name=\"");
                xml(&b, gcd_run_title(run, t, sizeof t));
                gcd_sb_printf(&b, "\">\n");
            }
            gcd_sb_printf(&b, "    <testcase classname=\"gradcheck-dist.%s\" name=\"mode %s (%s)\">\n", gcd_jstr(run, "probe"), gcd_jstr(run, "mode"), gcd_jstr(run, "role"));
            gcd_sb b2 = { 0 };
            const cJSON *f;
            cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(run, "findings")) {
                if (gcd_jbool(f, "counts")) gcd_sb_printf(&b2, "%s: %s\n", gcd_jstr(f, "kind"), gcd_jstr(f, "message"));
            }
            if (!gcd_jbool(e, "met")) {
                gcd_sb_printf(&b, "      <failure type=\"gradient\" message=\"");
                xml(&b, gcd_jstr(e, "message"));
                gcd_sb_printf(&b, "\">");
                xml(&b, b2.s ? b2.s : "");
                gcd_sb_printf(&b, "</failure>\n");
            } else if (!strcmp(gcd_jstr(e, "role"), "control")) {
                gcd_sb_printf(&b, "      <skipped message=\"");
                xml(&b, gcd_jstr(e, "message"));
                gcd_sb_printf(&b, "\"/>\n");
            }
            if (b2.s) {
                gcd_sb_printf(&b, "      <system-out>");
                xml(&b, b2.s);
                gcd_sb_printf(&b, "</system-out>\n");
            }
            gcd_sb_free(&b2);
            gcd_sb_printf(&b, "    </testcase>\n");
        }
        gcd_sb_printf(&b, "  </testsuite>\n");
    }
    if (errors) {
        gcd_sb_printf(&b, "  <testsuite name=\"run\">\n    <testcase classname=\"gradcheck-dist\" name=\"run\">\n      <error message=\"rank %d: ", gcd_jint(err, "rank"));
        xml(&b, gcd_jstr(err, "message"));
        gcd_sb_printf(&b, "\"/>\n    </testcase>\n  </testsuite>\n");
    }
    gcd_sb_printf(&b, "</testsuites>\n");
    return b.s;
}
