// The files a run or check leaves, each whole or absent.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The files a run or check leaves, each whole or absent: the JSON report at json, then the JUnit XML
// rendered from the same document at junit ("" for none). A failed write is a runtime failure: the code
// becomes 3, the document says why, and the JSON, when already written, is written again to say so.
// A path that could not be written is emptied (a reserved default name removed). Returns the code.
int write_reports(cJSON *doc, char *json, int reserved, char *junit, int code, double seconds) {
    char *path[2] = { json, junit };
    int junit_first = !strcmp(json, "-");   // stdout takes one document: the JSON last, never written twice
    for (int k = 0; k < 2; k++) {
        int i = k ^ junit_first;
        char err[PATH_MAX + 128], *xml = NULL;
        if (!path[i][0]) continue;
        int rc = i ? gcd_text_write(xml = gcd_render_junit(doc), "--junit", path[i], err, sizeof err) : gcd_report_write(doc, path[i], err, sizeof err);
        free(xml);
        if (!rc) continue;
        say("", err);
        if (!i && reserved) unlink(json);
        path[i][0] = 0;
        if (code == 3) continue;   // the document already says what failed first
        code = 3;
        gcd_report_finish(doc, 3, err, 0, seconds);
        if (i && !junit_first && json[0] && gcd_report_write(doc, json, err, sizeof err)) say("", err);
    }
    return code;
}

// reports/gradcheck-<UTC time>[-N].json, created empty and exclusively (O_EXCL): runs started in the
// same second never share a name. Returns 1 when a name was reserved.
int default_report_path(char *path, size_t len) {
    char stamp[32];
    time_t t = time(NULL);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", gmtime(&t));
    mkdir("reports", 0777);
    for (int i = 1; i < 10000; i++) {
        if (i == 1) snprintf(path, len, "reports/gradcheck-%s.json", stamp);
        else snprintf(path, len, "reports/gradcheck-%s-%d.json", stamp, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) return close(fd), 1;
        if (errno != EEXIST) break;
    }
    return 0;   // the write will say why
}

// ----------------------------------------------------------------------------
// broken streams: a closed stdout or stderr, /dev/full, a full file system. A write that fails is a
// runtime failure (exit 3), said on whichever stream still works.

static int closed_at_start[3];   // process-wide as the descriptors 0-2 are: what they were at the start

// A descriptor 0-2 closed by the caller is held by /dev/null opened read-only: no file the tool opens
// later becomes "stdout" (a report written into by printf), and every write to it fails (EBADF).
void std_fds_guard(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
        closed_at_start[fd] = 1;
        int n = open("/dev/null", O_RDONLY);
        if (n >= 0 && n != fd) dup2(n, fd), close(n);
    }
}

// fd cannot take what the tool writes there: closed, /dev/full, a file on a full file system. For
// what another process (mpirun) wrote for us and whose errors we never see.
int stream_lost(int fd) {
    struct stat st;
    struct statfs fs;
    if (closed_at_start[fd] || fstat(fd, &st) != 0 || (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY) return 1;
    if (S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 7) return 1;   // /dev/full
    return S_ISREG(st.st_mode) && fstatfs(fd, &fs) == 0 && fs.f_blocks && !fs.f_bavail;
}

// stdout flushed; 0, or 3 after saying on stderr what was lost
int stdout_done(const char *what) {
    errno = 0;
    int ok = fflush(stdout) == 0 && !ferror(stdout) && !closed_at_start[1];
    if (ok) return 0;
    fprintf(stderr, "gradcheck-dist: %s: writing to stdout: %s\n", what, closed_at_start[1] ? "it is closed" : strerror(errno ? errno : EIO));
    return 3;
}

// a message naming outside text (a path, a tensor name) on stderr, as a terminal may show it
void say(const char *prefix, const char *text) {
    char *t = gcd_term_str(text);
    fprintf(stderr, "gradcheck-dist: %s%s\n", prefix, t);
    free(t);
}

// "PREFIX PATH" and a newline, the path escaped as say() escapes: a --json path is the user's bytes
void put_path(FILE *f, const char *prefix, const char *path) {
    char *t = gcd_term_str(path);
    fprintf(f, "%s%s\n", prefix, t);
    free(t);
}

// What mpirun forwarded for the ranks (the table, --json -, the progress) went to the launcher's stdout
// and stderr, whose write errors only mpirun saw: a stream that cannot take it makes the code 3.
int launcher_streams_code(int code) {
    int out = stream_lost(1), err = stream_lost(2);
    if (code >= 3 || (!out && !err)) return code;
    const char *msg = out && err ? "stdout and stderr" : out ? "stdout" : "stderr";
    FILE *f = err ? stdout : stderr;
    if (!(out && err)) fprintf(f, "gradcheck-dist: %s cannot be written (closed, /dev/full or a full file system): the table or report sent there is lost\n", msg), fflush(f);
    return 3;
}
