/*
 * report_junit: a report as JUnit XML for CI dashboards. One <testcase> per run, a <testsuite> for each
 * stretch of runs with the same title, and every <testsuite> (and the <testsuites> root) carrying tests,
 * failures, errors, skipped and time, so that tests = failures + errors + skipped + passed everywhere.
 *   under test, no finding                   -> passed
 *   under test, findings                     -> <failure> (the findings in its text)
 *   control that showed its signature        -> passed (what it showed in <system-out>): the tool caught it
 *   control that did not                     -> <failure>
 *   runtime failure ("result": "error")      -> one more testcase with an <error>
 * Nothing is ever skipped: skipped="0" is written because consumers expect the attribute.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "report/report.h"
#include "report/report_render.h"

// XML text and attribute values: the five entities escaped, control characters dropped (XML 1.0 has no
// way to say them), invalid UTF-8 and the noncharacters U+FFFE, U+FFFF replaced by U+FFFD
static void xml(gcd_sb *b, const char *str) {
    const unsigned char *s = (const unsigned char *)str, *end = s + strlen(str);
    while (*s) {
        size_t k = gcd_utf8_char(s, (size_t)(end - s));
        if (!k) { gcd_sb_printf(b, "\xef\xbf\xbd"); s++; continue; }
        if (k == 3 && s[0] == 0xef && s[1] == 0xbf && s[2] >= 0xbe) { gcd_sb_printf(b, "\xef\xbf\xbd"); s += 3; continue; }   // U+FFFE, U+FFFF: not XML characters
        switch (*s) {
        case '&': gcd_sb_printf(b, "&amp;"); break;
        case '<': gcd_sb_printf(b, "&lt;"); break;
        case '>': gcd_sb_printf(b, "&gt;"); break;
        case '"': gcd_sb_printf(b, "&quot;"); break;
        case '\'': gcd_sb_printf(b, "&apos;"); break;
        default:
            if (*s >= 0x20 || *s == '\n' || *s == '\t') gcd_sb_append(b, s, k);
        }
        s += k;
    }
}

static double seconds_of(double s) { return isfinite(s) && s > 0 ? s : 0.0; }   // absent (older reports), odd: 0

typedef struct {
    int tests, failures, errors;
    double time;
} counts;

// <testsuite ...> with its counts, then its testcases (body)
static void suite(gcd_sb *b, const char *name, const counts *c, const char *stamp, const gcd_sb *body) {
    gcd_sb_printf(b, "  <testsuite name=\"");
    xml(b, name);
    gcd_sb_printf(b, "\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"0\" time=\"%.6f\" timestamp=\"", c->tests, c->failures, c->errors, c->time);
    xml(b, stamp);
    gcd_sb_printf(b, "\">\n");
    if (body->s) gcd_sb_append(b, body->s, body->len);
    gcd_sb_printf(b, "  </testsuite>\n");
}

// one run's testcase; returns 1 when it failed
static int testcase(gcd_sb *b, const cJSON *run, const cJSON *e) {
    int met = gcd_jbool(e, "met");
    gcd_sb found = { 0 };
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(run, "findings")) {
        if (gcd_jbool(f, "counts")) gcd_sb_printf(&found, "%s: %s\n", gcd_jstr(f, "kind"), gcd_jstr(f, "message"));
    }
    gcd_sb_printf(b, "    <testcase classname=\"gradcheck-dist.");
    xml(b, gcd_jstr(run, "probe"));
    gcd_sb_printf(b, "\" name=\"%s ", strcmp(gcd_jstr(run, "probe"), "check") ? "mode" : "stage");
    xml(b, gcd_jstr(run, "mode"));
    gcd_sb_printf(b, " (");
    xml(b, gcd_jstr(run, "role"));
    gcd_sb_printf(b, ")\" time=\"%.6f\">\n", seconds_of(gcd_jnum(run, "seconds")));
    if (!met) {
        gcd_sb_printf(b, "      <failure type=\"gradient\" message=\"");
        xml(b, e ? gcd_jstr(e, "message") : "no expectation recorded for this run");
        gcd_sb_printf(b, "\">");
        xml(b, found.s ? found.s : "");
        gcd_sb_printf(b, "</failure>\n");
    }
    gcd_sb_printf(b, "      <system-out>");   // what was expected and what was found, also when it passed
    xml(b, gcd_jstr(e, "message"));
    gcd_sb_printf(b, "\n");
    xml(b, found.s ? found.s : "");
    gcd_sb_printf(b, "</system-out>\n    </testcase>\n");
    gcd_sb_free(&found);
    return !met;
}

static char *render_junit(const cJSON *doc) {
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(doc, "environment");
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs"), *exps = cJSON_GetObjectItemCaseSensitive(doc, "expectations");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    char stamp[32];   // ISO 8601 without the zone, as JUnit's schema has it; the report's start_time, UTC
    snprintf(stamp, sizeof stamp, "%.*s", (int)strcspn(gcd_jstr(env, "start_time"), "Z"), gcd_jstr(env, "start_time"));

    gcd_sb suites = { 0 }, body = { 0 };
    counts all = { 0 }, cur = { 0 };
    char t[160], open_title[160] = "";
    const cJSON *run, *e = exps ? exps->child : NULL;
    cJSON_ArrayForEach(run, runs) {
        gcd_run_title(run, t, sizeof t);
        if (cur.tests && strcmp(t, open_title)) {
            suite(&suites, open_title, &cur, stamp, &body);
            gcd_sb_free(&body);
            cur = (counts){ 0 };
        }
        snprintf(open_title, sizeof open_title, "%s", t);
        cur.tests++, all.tests++;
        int failed = testcase(&body, run, e);
        cur.failures += failed, all.failures += failed;
        cur.time += seconds_of(gcd_jnum(run, "seconds")), all.time += seconds_of(gcd_jnum(run, "seconds"));
        e = e ? e->next : NULL;
    }
    if (cur.tests) suite(&suites, open_title, &cur, stamp, &body);
    gcd_sb_free(&body);
    double wall = gcd_jnum(env, "wall_seconds"), ran = all.time;
    all.time = isfinite(wall) && wall > ran ? wall : ran;
    if (cJSON_IsObject(err) || !strcmp(gcd_jstr(doc, "result"), "error")) {   // the time no run accounts for went here
        counts c = { 1, 0, 1, all.time - ran };
        gcd_sb_printf(&body, "    <testcase classname=\"gradcheck-dist\" name=\"runtime\" time=\"%.6f\">\n      <error type=\"runtime\" message=\"", c.time);
        gcd_sb msg = { 0 };
        if (cJSON_IsObject(err)) gcd_sb_printf(&msg, "rank %d: %s", gcd_jint(err, "rank"), gcd_jstr(err, "message"));
        else gcd_sb_printf(&msg, "result: error (exit %d)", gcd_jint(doc, "exit_code"));
        xml(&body, msg.s);
        gcd_sb_printf(&body, "\">");
        xml(&body, msg.s);
        gcd_sb_printf(&body, "</error>\n    </testcase>\n");
        suite(&suites, "runtime", &c, stamp, &body);
        gcd_sb_free(&msg), gcd_sb_free(&body);
        all.tests++, all.errors++;
    }
    gcd_sb b = { 0 };
    gcd_sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    gcd_sb_printf(&b, "<testsuites name=\"gradcheck-dist\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"0\" time=\"%.6f\">\n", all.tests,
                  all.failures, all.errors, all.time);
    if (suites.s) gcd_sb_append(&b, suites.s, suites.len);
    gcd_sb_printf(&b, "</testsuites>\n");
    gcd_sb_free(&suites);
    return b.s;
}

// the strings as a terminal shows them (an ESC in a name is \\e in a CI log too), then as XML text
char *gcd_render_junit(const cJSON *doc) {
    cJSON *copy;
    char *text = render_junit(gcd_report_safe(doc, &copy));
    cJSON_Delete(copy);
    return text;
}
