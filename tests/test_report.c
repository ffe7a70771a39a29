// The JSON report without MPI: non-finite gradients written as strings and read back, a writer
// killed between its temporary file and the rename, and reports that are truncated, foreign or newer;
// a probe's setup once in the document, tensors elided above 4096 elements unless --full, and reports
// of schema /1 (a setup in every run) still read and rendered alike.
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "report/report.h"
#include "report/report_render.h"
#include "diagnose/verdict.h"

// The report writer's renameat, interposed: a child with kill_in_rename set dies right there.
static int kill_in_rename;
int renameat(int fromfd, const char *from, int tofd, const char *to) {
    if (kill_in_rename) raise(SIGKILL);
    return (int)syscall(SYS_renameat2, fromfd, from, tofd, to, 0);
}

static char dir[] = "/tmp/gcd-test-report-XXXXXX";

static char *path_in(const char *name) {
    static char p[8][256];
    static int i;
    char *s = p[i++ % 8];
    snprintf(s, 256, "%s/%s", dir, name);
    return s;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = calloc(1, (size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    return s;
}

static void spit(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
}

// a two-rank run whose fc1.weight gradient holds a NaN and an infinity, and whose fc1.bias is None
static cJSON *nonfinite_report(void) {
    static double init[2][4], local[2][8], reference[2][4] = { { 1, 2, 3, 4 }, { 1, 1 } }, loss[2] = { 0.5, 0.5 };
    static double reduced[4] = { NAN, 1, INFINITY, -INFINITY };
    static unsigned char has[2][2] = { { 1, 1 }, { 0, 0 } };
    static gcd_param_result params[2];
    gcd_run_result res = { .probe = "simplenet", .mode = GCD_GATHER_ON, .world = 2, .nparam = 2, .param = params, .nloss = 1, .loss = loss,
                           .ref_loss = 0.5, .tol = GCD_TOL };
    res.param[0] = (gcd_param_result){ .name = "fc1.weight", .ndim = 2, .shape = { 2, 2 }, .n = 4, .init = init[0], .local = local[0],
                                       .has = has[0], .nhave = 2, .reduced = reduced, .reference = reference[0] };
    res.param[1] = (gcd_param_result){ .name = "fc1.bias", .ndim = 1, .shape = { 2 }, .n = 2, .init = init[1], .local = local[1],
                                       .has = has[1], .nhave = 0, .reduced = NULL, .reference = reference[1] };
    gcd_verdict(&res);
    CHECK(res.param[0].status == GCD_ST_NONFINITE && res.param[0].nonfinite == 3 && res.param[0].first_nonfinite == 0,
          "status %s, %ld non-finite, first at %ld", gcd_status_str(res.param[0].status), res.param[0].nonfinite, res.param[0].first_nonfinite);
    CHECK(res.param[1].status == GCD_ST_NONE, "fc1.bias: %s", gcd_status_str(res.param[1].status));
    char *argv[] = { "gradcheck-dist", "run" }, *hosts[] = { "a", "b" };
    gcd_env env = { .backend = "mpi", .world = 2, .hostnames = hosts, .start_time = "2026-01-01T00:00:00Z" };
    cJSON *doc = gcd_report_new(2, argv, &env);
    gcd_report_add_run(doc, &res, "test", 0);
    gcd_report_finish(doc, 1, NULL, 0, 0.25);
    return doc;
}

static void nonfinite_should_be_strings(void) {
    cJSON *doc = nonfinite_report();
    char err[512];
    CHECK(gcd_report_write(doc, path_in("nan.json"), err, sizeof err) == 0, "write: %s", err);
    char *text = slurp(path_in("nan.json"));
    CHECK(text && strstr(text, "\"nan\"") && strstr(text, "\"inf\"") && strstr(text, "\"-inf\""), "the file must spell nan, inf, -inf:\n%s", text);
    free(text);
    cJSON *back = gcd_report_load(path_in("nan.json"), err, sizeof err);
    CHECK(back != NULL, "load: %s", err);
    const cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(back, "runs"), 0), "params"), 0);
    const cJSON *red = cJSON_GetObjectItem(p, "reduced");
    CHECK(isnan(gcd_json_num(cJSON_GetArrayItem(red, 0))) && gcd_json_num(cJSON_GetArrayItem(red, 1)) == 1 &&
              gcd_json_num(cJSON_GetArrayItem(red, 2)) == INFINITY && gcd_json_num(cJSON_GetArrayItem(red, 3)) == -INFINITY,
          "reduced must read back as nan, 1, inf, -inf");
    CHECK(!strcmp(cJSON_GetObjectItem(p, "status")->valuestring, "nonfinite"), "status");
    const cJSON *none = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(back, "runs"), 0), "params"), 1);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(none, "reduced")), "a None gradient is null, and only that");
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetObjectItem(none, "local"), 0)), "a rank's None is null");
    char *t1 = gcd_render_text(doc), *t2 = gcd_render_text(back);
    CHECK(!strcmp(t1, t2), "text from the written and the read report differ");
    CHECK(strstr(t1, "nonfinite") != NULL, "the table must show nonfinite");
    free(t1), free(t2);
    cJSON_Delete(back);
    cJSON_Delete(doc);
}

// ----------------------------------------------------------------------------
// whole or not at all

static int write_in_child_killed_at_rename(const cJSON *doc, const char *path) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char err[256];
        kill_in_rename = 1;
        gcd_report_write(doc, path, err, sizeof err);
        _exit(0);   // not reached: rename kills
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
}

static void killed_writer_should_leave_no_half_report(void) {
    cJSON *doc = nonfinite_report();
    const char *path = path_in("killed.json");
    CHECK(write_in_child_killed_at_rename(doc, path), "the child must die in rename");
    CHECK(access(path, F_OK) != 0, "a report appeared under the final name although the writer died before rename");
    spit(path, "old report\n", 11);   // an earlier report under that name stays whole
    CHECK(write_in_child_killed_at_rename(doc, path), "the child must die in rename");
    char *s = slurp(path);
    CHECK(s && !strcmp(s, "old report\n"), "the earlier report was changed: %s", s);
    free(s);
    char err[256];   // and without the kill, the same call writes it
    CHECK(gcd_report_write(doc, path, err, sizeof err) == 0, "%s", err);
    cJSON *back = gcd_report_load(path, err, sizeof err);
    CHECK(back != NULL, "%s", err);
    cJSON_Delete(back);
    const char *absent = path_in("no-such-dir/x.json");   // inside this test's own directory: known absent
    CHECK(gcd_report_write(doc, absent, err, sizeof err) != 0 && strstr(err, absent), "an unwritable path must fail naming it: %s", err);
    cJSON_Delete(doc);
}

// ----------------------------------------------------------------------------
// what is not a report

static void load_should_reject(const char *name, const char *content, size_t n, const char *why) {
    char err[512] = "";
    spit(path_in(name), content, n);
    cJSON *doc = gcd_report_load(path_in(name), err, sizeof err);
    CHECK(doc == NULL, "%s: loaded", name);
    CHECK(strstr(err, why) && strstr(err, name), "%s: message '%s' must name the file and say '%s'", name, err, why);
    cJSON_Delete(doc);
}

static void bad_reports_should_be_rejected(void) {
    cJSON *doc = nonfinite_report();
    char *text = cJSON_Print(doc);
    load_should_reject("truncated.json", text, strlen(text) / 2, "truncated");
    load_should_reject("foreign.json", "{\"hello\": 1}", 12, "not a gradcheck-dist report");
    load_should_reject("array.json", "[1, 2, 3]", 9, "not a gradcheck-dist report");
    load_should_reject("empty.json", "", 0, "not a gradcheck-dist report");
    load_should_reject("binary.json", "\0\1\2", 3, "not a gradcheck-dist report");
    char next[64];   // the version after this build's
    snprintf(next, sizeof next, "gradcheck-dist.report/%d", GCD_REPORT_VERSION + 1);
    cJSON_ReplaceItemInObject(doc, "schema", cJSON_CreateString(next));
    char *newer = cJSON_Print(doc);
    load_should_reject("newer.json", newer, strlen(newer), "newer");
    cJSON_DeleteItemFromObject(doc, "schema");
    cJSON_AddStringToObject(doc, "schema", GCD_REPORT_SCHEMA);
    cJSON_DeleteItemFromObject(doc, "runs");
    char *noruns = cJSON_Print(doc);
    load_should_reject("noruns.json", noruns, strlen(noruns), "runs");
    free(text), free(newer), free(noruns);
    // schema versions compared exactly; numbers the renderings use checked, the bad key named by its path
    static const char *const odd[] = { "gradcheck-dist.report/-1", "gradcheck-dist.report/abc", "gradcheck-dist.report/", "gradcheck-dist.report/1x" };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        cJSON *d = nonfinite_report();
        cJSON_ReplaceItemInObject(d, "schema", cJSON_CreateString(odd[i]));
        char *t = cJSON_Print(d);
        load_should_reject("odd-schema.json", t, strlen(t), "not one this gradcheck-dist");
        free(t), cJSON_Delete(d);
    }
    static const char *const bad_numbers[] = { "runs[0].params[1].shape", "environment.world", "exit_code" };   // the path named
    for (size_t i = 0; i < sizeof bad_numbers / sizeof bad_numbers[0]; i++) {
        cJSON *d = nonfinite_report();
        if (i == 0) cJSON_ReplaceItemInArray(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "runs"), 0), "params"), 1), "shape"), 0, cJSON_CreateNumber(1e12));
        if (i == 1) cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "environment"), "world", cJSON_CreateNumber(-3));
        if (i == 2) cJSON_ReplaceItemInObject(d, "exit_code", cJSON_CreateNumber(2147483648.0));
        char *t = cJSON_Print(d);
        load_should_reject("bad-number.json", t, strlen(t), bad_numbers[i]);
        free(t), cJSON_Delete(d);
    }
    cJSON_Delete(doc);
}

// every double written reads back bit-exact: values that need 16 and 17 significant digits
static void numbers_should_round_trip_exactly(void) {
    const double v[] = { 0.5406103730201721, 0.1 + 0.2, 1.0 / 3, 2.0 / 3, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                         -0.0, 123456789012345678.0, 0.1, 1e-9, 9007199254740993.0, -1.0000000000000002 };
    size_t n = sizeof v / sizeof v[0];
    cJSON *doc = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(doc, "v");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    char *text = gcd_json_print(doc);
    cJSON *back = cJSON_Parse(text);
    CHECK(back != NULL, "gcd_json_print wrote invalid JSON: %s", text);
    const cJSON *b = cJSON_GetObjectItem(back, "v");
    for (size_t i = 0; back && i < n; i++) {
        double x = cJSON_GetArrayItem(b, (int)i)->valuedouble;
        CHECK(memcmp(&x, &v[i], sizeof x) == 0, "%.17g read back as %.17g from %s", v[i], x, text);
    }
    CHECK(strstr(text, "0.5406103730201721") && strstr(text, "0.30000000000000004") && strstr(text, "[0.5"), "not the shortest exact form: %s", text);
    // the shortest form, subnormals too (fewer significant bits: fewer than 15 digits may do)
    static const struct { double v; const char *s; } shortest[] = {
        { 0.1, "0.1" }, { 0.1 + 0.2, "0.30000000000000004" }, { 5e-324, "5e-324" }, { 1e-320, "1e-320" }, { 4.4e-323, "4.4e-323" },
        { 2.225073858507201e-308, "2.225073858507201e-308" }, { 1.112536929253601e-308, "1.112536929253601e-308" },
        { 2.2250738585072014e-308, "2.2250738585072014e-308" }, { -0.0, "-0" },
    };
    for (size_t i = 0; i < sizeof shortest / sizeof *shortest; i++) {
        char buf[32];
        int k = gcd_num_shortest(buf, shortest[i].v);
        CHECK(!strcmp(buf, shortest[i].s) && k == (int)strlen(buf), "gcd_num_shortest(%.17g) wrote %s, expected %s", shortest[i].v, buf, shortest[i].s);
    }
    free(text);
    cJSON_Delete(back);
    cJSON_Delete(doc);
}

// ----------------------------------------------------------------------------
// setups once per probe; values elided above the limit; schema /1 still read

// two ranks of "contrastive" with a 4096- and a 4097-element parameter and input (value i + 1 at i,
// rank k's shifted by 1e4 k; the parameters' values are rank 0's), under nmodes modes; then one run of
// "simplenet" with a 2-element parameter
enum { SMALL = GCD_VALUES_LIMIT, BIG = GCD_VALUES_LIMIT + 1 };
static double vals[2][2 * BIG + 1];   // (world, SMALL) and (world, BIG): a row for every rank
static cJSON *sized_report(gcd_values values, int nmodes) {
    static double loss[2] = { 1, 1 };
    static unsigned char has[2] = { 1, 1 };
    for (int k = 0; k < 2; k++)   // vals[0]: rows of SMALL, vals[1]: of BIG
        for (int i = 0; i < BIG; i++) vals[0][k * SMALL + i] = vals[1][k * BIG + i] = i + 1 + 1e4 * k;
    char *argv[] = { "gradcheck-dist", "run" }, *hosts[] = { "a", "b" };
    gcd_env env = { .backend = "mpi", .world = 2, .hostnames = hosts, .start_time = "2026-01-01T00:00:00Z" };
    cJSON *doc = gcd_report_new(2, argv, &env);
    for (int m = 0; m < nmodes + 1; m++) {
        int simple = m == nmodes;
        gcd_param_result params[2];
        gcd_run_result res = { .probe = simple ? "simplenet" : "contrastive", .mode = simple ? GCD_GATHER_ON : m, .world = 2, .nparam = simple ? 1 : 2,
                               .param = params, .nloss = 1, .loss = loss, .ref_loss = 1, .tol = GCD_TOL, .ninput = 2,
                               .input_name = { "x", "y" }, .input_ndim = { 1, 1 }, .input_shape = { { SMALL }, { simple ? 3 : BIG } },
                               .input_n = { SMALL, simple ? 3 : BIG }, .inputs = { vals[0], vals[1] } };
        if (simple) res.inputs[0] = vals[0], res.input_n[0] = SMALL;
        for (int i = 0; i < res.nparam; i++) {
            size_t n = simple ? 2 : i ? BIG : SMALL;
            params[i] = (gcd_param_result){ .name = i ? "big" : "small", .ndim = 1, .shape = { (int)n }, .n = n, .init = vals[i], .local = vals[i],
                                            .has = has, .nhave = 2, .reduced = vals[i], .reference = vals[i], .breaks_at = -1 };
        }
        gcd_verdict(&res);
        gcd_report_add_run(doc, &res, "test", values);
    }
    gcd_report_finish(doc, 0, NULL, 0, 0.25);
    return doc;
}

static const cJSON *at(const cJSON *o, const char *path) {   // "runs.0.params.1.local.1"
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(k)) : cJSON_GetObjectItemCaseSensitive(o, k);
    return o;
}

// v: the whole array of n values starting at vals[row][k * BIG]
static int whole_values(const cJSON *v, int n, int k) {
    if (cJSON_GetArraySize(v) != n) return 0;
    for (int i = 0; i < n; i++)
        if (cJSON_GetArrayItem(v, i)->valuedouble != i + 1 + 1e4 * k) return 0;
    return 1;
}
static int elided_values(const cJSON *v, int n, int k) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (i + 1 + 1e4 * k) * (i + 1 + 1e4 * k);
    return cJSON_IsTrue(at(v, "elided")) && gcd_json_num(at(v, "numel")) == n && close_to(gcd_json_num(at(v, "norm")), sqrt(ss), 1e-14) &&
           whole_values(at(v, "first"), GCD_VALUES_FIRST, k);
}

static void setup_should_appear_once_per_probe(void) {
    cJSON *doc = sized_report(GCD_VALUES_LIMITED, 3);
    const cJSON *setups = at(doc, "setups"), *run;
    CHECK(cJSON_GetArraySize(setups) == 2 && !strcmp(gcd_jstr(at(setups, "0"), "probe"), "contrastive") &&
              !strcmp(gcd_jstr(at(setups, "1"), "probe"), "simplenet"),
          "one setup per probe, in the order of their first runs: %d", cJSON_GetArraySize(setups));
    cJSON_ArrayForEach(run, at(doc, "runs")) {
        CHECK(!cJSON_GetObjectItem(run, "setup"), "a run repeats its setup");
        const cJSON *s = gcd_report_run_setup(doc, run);
        CHECK(s && !strcmp(gcd_jstr(s, "probe"), gcd_jstr(run, "probe")), "the setup of a %s run", gcd_jstr(run, "probe"));
    }
    cJSON_Delete(doc);
}

static void values_should_be_elided_over_the_limit(void) {
    cJSON *doc = sized_report(GCD_VALUES_LIMITED, 1);
    CHECK(gcd_json_num(at(doc, "values.limit")) == GCD_VALUES_LIMIT && cJSON_IsFalse(at(doc, "values.full")), "values: limit 4096, not full");
    CHECK(whole_values(at(doc, "setups.0.params.0.init"), SMALL, 0), "init of 4096 elements: written whole");
    CHECK(elided_values(at(doc, "setups.0.params.1.init"), BIG, 0), "init of 4097 elements: elided with numel, norm, first 16");
    CHECK(whole_values(at(doc, "setups.0.inputs.1.tensors.0.data"), SMALL, 1), "rank 1's input of 4096: whole, rank 1's values");
    CHECK(elided_values(at(doc, "setups.0.inputs.1.tensors.1.data"), BIG, 1), "rank 1's input of 4097: elided, rank 1's values");
    CHECK(whole_values(at(doc, "runs.0.params.0.local.1"), SMALL, 1) && whole_values(at(doc, "runs.0.params.0.reduced"), SMALL, 0) &&
              whole_values(at(doc, "runs.0.params.0.reference"), SMALL, 0),
          "a 4096-element gradient: local, reduced and reference whole");
    CHECK(elided_values(at(doc, "runs.0.params.1.local.1"), BIG, 1) && elided_values(at(doc, "runs.0.params.1.reduced"), BIG, 0) &&
              elided_values(at(doc, "runs.0.params.1.reference"), BIG, 0),
          "a 4097-element gradient: local, reduced and reference elided");
    char err[512], *t1 = gcd_render_text(doc);   // and it reads back, the loader checking every elided tensor
    CHECK(gcd_report_write(doc, path_in("elided.json"), err, sizeof err) == 0, "write: %s", err);
    cJSON *back = gcd_report_load(path_in("elided.json"), err, sizeof err);
    CHECK(back != NULL, "load: %s", err);
    char *t2 = back ? gcd_render_text(back) : NULL;
    CHECK(t2 && !strcmp(t1, t2), "the text of an elided report read back differs");
    free(t1), free(t2), cJSON_Delete(back);
    cJSON_ReplaceItemInObject((cJSON *)at(doc, "runs.0.params.1.reduced"), "numel", cJSON_CreateNumber(4096));
    char *bad_numel = gcd_json_print(doc);
    load_should_reject("bad-numel.json", bad_numel, strlen(bad_numel), "runs[0].params[1].reduced");
    free(bad_numel);
    cJSON_Delete(doc);

    doc = sized_report(GCD_VALUES_FULL, 1);
    CHECK(cJSON_IsTrue(at(doc, "values.full")) && cJSON_IsNull(at(doc, "values.limit")), "--full: values.full true, no limit");
    CHECK(whole_values(at(doc, "setups.0.params.1.init"), BIG, 0) && whole_values(at(doc, "setups.0.inputs.1.tensors.1.data"), BIG, 1) &&
              whole_values(at(doc, "runs.0.params.1.local.1"), BIG, 1) && whole_values(at(doc, "runs.0.params.1.reduced"), BIG, 0) &&
              whole_values(at(doc, "runs.0.params.1.reference"), BIG, 0),
          "--full: every value of the 4097-element tensors");
    cJSON_Delete(doc);

    doc = sized_report(GCD_VALUES_NONE, 1);
    CHECK(cJSON_IsNull(at(doc, "setups.0.params.1.init")) && cJSON_IsNull(at(doc, "setups.0.inputs.0.tensors.0.data")) &&
              !at(doc, "runs.0.params.0.local") && !at(doc, "runs.0.params.0.reduced") && !at(doc, "runs.0.params.0.reference"),
          "--summary-only: no values at all");
    cJSON_Delete(doc);
}

// a /2 document as /1 wrote it: the setup (without its probe) in every run, no setups, no values
static cJSON *as_schema_1(const cJSON *doc) {
    cJSON *old = cJSON_Duplicate(doc, 1), *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItem(old, "runs")) {
        cJSON *s = cJSON_Duplicate(gcd_report_run_setup(old, run), 1);
        cJSON_DeleteItemFromObject(s, "probe");
        cJSON_AddItemToObject(run, "setup", s);
    }
    cJSON_DeleteItemFromObject(old, "setups");
    cJSON_DeleteItemFromObject(old, "values");
    cJSON_ReplaceItemInObject(old, "schema", cJSON_CreateString("gradcheck-dist.report/1"));
    return old;
}

static void old_reports_should_render_alike(void) {
    cJSON *doc = sized_report(GCD_VALUES_FULL, 2), *old = as_schema_1(doc);
    char *text = gcd_json_print(old), err[512] = "";
    cJSON *back = gcd_report_parse(text, strlen(text), "old.json", err, sizeof err);
    CHECK(back != NULL, "a schema /1 report must load: %s", err);
    const cJSON *run, *runs = back ? at(back, "runs") : NULL;
    int i = 0;
    cJSON_ArrayForEach(run, runs) {
        const cJSON *s = gcd_report_run_setup(back, run), *mine = gcd_report_run_setup(doc, cJSON_GetArrayItem(at(doc, "runs"), i));
        CHECK(s && s == cJSON_GetObjectItem(run, "setup"), "/1: runs[%d]'s setup is its own", i);
        CHECK(cJSON_Compare(at(s, "params"), at(mine, "params"), 1) && cJSON_Compare(at(s, "inputs"), at(mine, "inputs"), 1),
              "/1: runs[%d]'s setup is not the /2 one of its probe", i);
        i++;
    }
    char *(*render[])(const cJSON *) = { gcd_render_text, gcd_render_md, gcd_render_junit };
    for (int r = 0; back && r < 3; r++) {
        char *a = render[r](doc), *b = render[r](back);
        // md embeds the JSON (or its size) in its last block: the same up to there
        const char *json = r == 1 ? strstr(a, "<details>") : NULL;
        size_t n = json ? (size_t)(json - a) : strlen(a) + 1;
        CHECK(a && b && strlen(a) > 100 && !strncmp(a, b, n), "rendering %d of the /1 report differs from the /2 one's", r);
        free(a), free(b);
    }
    char next[64];
    snprintf(next, sizeof next, "gradcheck-dist.report/%d", GCD_REPORT_VERSION + 1);
    cJSON_ReplaceItemInObject(old, "schema", cJSON_CreateString(next));
    char *newer = gcd_json_print(old);
    load_should_reject("newer.json", newer, strlen(newer), "newer");
    free(newer), free(text);
    cJSON_Delete(back), cJSON_Delete(old), cJSON_Delete(doc);
}

int main(void) {
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    numbers_should_round_trip_exactly();
    nonfinite_should_be_strings();
    killed_writer_should_leave_no_half_report();
    bad_reports_should_be_rejected();
    setup_should_appear_once_per_probe();
    values_should_be_elided_over_the_limit();
    old_reports_should_render_alike();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) perror("rm");
    printf("test_report: %s, %d failure(s)\n", check_failures ? "FAILED" : "passed", check_failures);
    return check_failures != 0;
}
