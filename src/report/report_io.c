/*
 * report_io: a report's JSON text in and out. Printing (each double in its shortest exact form),
 * writing (whole or not at all; devices and FIFOs straight through, never replaced), and loading
 * (bounded, every key the renderings read validated, with the JSON path of a bad one). No probe, no
 * check, no MPI: the fuzz target links this file and the renderings alone.
 */
#define _GNU_SOURCE   // fopencookie
#include <dirent.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "report/report.h"

double gcd_json_num(const cJSON *v) {
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsString(v)) {
        if (!strcmp(v->valuestring, "inf")) return INFINITY;
        if (!strcmp(v->valuestring, "-inf")) return -INFINITY;
    }
    return NAN;
}

const cJSON *gcd_report_run_setup(const cJSON *doc, const cJSON *run) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(run, "setup"), *probe = cJSON_GetObjectItemCaseSensitive(run, "probe");
    if (s || !cJSON_IsString(probe)) return s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(doc, "setups")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "probe");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, probe->valuestring)) return s;
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// printing: every double in its shortest form that reads back bit-exact (cJSON_Print stops at 15
// digits when that is "close enough"); arrays of plain values on one line. Into a file the text is
// streamed, 64 KiB at a time: a --full report is never held twice, as a tree and as text.

typedef struct {
    gcd_sb b;
    FILE *f;   // NULL: the whole text stays in b
    int ok;    // every fwrite wrote all it was given
} printer;

static void spill(printer *p, size_t at_least) {
    if (!p->f || p->b.len < at_least || !p->b.len) return;
    p->ok &= fwrite(p->b.s, 1, p->b.len, p->f) == p->b.len;
    p->b.len = 0;
}

int gcd_num_shortest(char buf[32], double v) {
    int k = 0;
    // 15 digits (DBL_DIG) read back as the shortest form of a normal double; a subnormal has fewer
    // significant bits, so its shortest form may be shorter still
    for (int digits = v != 0 && fabs(v) < DBL_MIN ? 1 : 15; digits <= 17; digits++)   // 17 digits always read back
        if ((k = snprintf(buf, 32, "%.*g", digits, v)), digits == 17 || strtod(buf, NULL) == v) break;
    return k;
}

static void print_num(gcd_sb *b, double v) {
    char buf[32];
    if (!isfinite(v)) return gcd_sb_append(b, "null", 4);   // the builders never store these as numbers
    gcd_sb_append(b, buf, (size_t)gcd_num_shortest(buf, v));
}

// a JSON string of valid UTF-8: controls (C0 and DEL) escaped, bytes that are not UTF-8 (a file name from a
// non-UTF-8 locale) replaced by U+FFFD
static void print_str(gcd_sb *b, const char *s) {
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    gcd_sb_append(b, "\"", 1);
    while (p < end) {
        const unsigned char *q = p;
        while (q < end && *q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\') q++;   // the plain run
        gcd_sb_append(b, p, (size_t)(q - p));
        if ((p = q) >= end) break;
        size_t k = *p < 0x80 ? 1 : gcd_utf8_char(p, (size_t)(end - p));
        if (!k) gcd_sb_append(b, "\\ufffd", 6), k = 1;
        else if (*p == '"' || *p == '\\') gcd_sb_printf(b, "\\%c", *p);
        else if (*p == '\n') gcd_sb_printf(b, "\\n");
        else if (*p == '\t') gcd_sb_printf(b, "\\t");
        else if (*p < 0x20 || *p == 0x7f) gcd_sb_printf(b, "\\u%04x", *p);   // DEL too: no control character
        else gcd_sb_append(b, p, k);
        p += k;
    }
    gcd_sb_append(b, "\"", 1);
}

static void print_value(printer *p, const cJSON *v, int depth) {
    gcd_sb *b = &p->b;
    if (cJSON_IsNull(v) || cJSON_IsInvalid(v)) gcd_sb_printf(b, "null");
    else if (cJSON_IsTrue(v)) gcd_sb_printf(b, "true");
    else if (cJSON_IsFalse(v)) gcd_sb_printf(b, "false");
    else if (cJSON_IsNumber(v)) print_num(b, v->valuedouble);
    else if (cJSON_IsString(v)) print_str(b, v->valuestring);
    else if (cJSON_IsRaw(v)) gcd_sb_printf(b, "%s", v->valuestring);
    else {
        int object = cJSON_IsObject(v), flat = !object;
        const cJSON *c;
        cJSON_ArrayForEach(c, v) flat &= !cJSON_IsArray(c) && !cJSON_IsObject(c);
        gcd_sb_printf(b, "%c", object ? '{' : '[');
        int i = 0;
        cJSON_ArrayForEach(c, v) {
            if (!flat) gcd_sb_printf(b, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
            else if (i) gcd_sb_append(b, ", ", 2);
            i++;
            if (object) print_str(b, c->string), gcd_sb_printf(b, ": ");
            print_value(p, c, depth + 1);
            spill(p, 1 << 16);
        }
        if (!flat && i) gcd_sb_printf(b, "\n%*s", 2 * depth, "");
        gcd_sb_printf(b, "%c", object ? '}' : ']');
    }
}

char *gcd_json_print(const cJSON *doc) {
    printer p = { .ok = 1 };
    print_value(&p, doc, 0);
    return p.b.s;
}

// the text and a newline into f; 0 when a write failed (errno says why)
static int print_to(const cJSON *doc, FILE *f) {
    printer p = { .f = f, .ok = 1 };
    print_value(&p, doc, 0);
    gcd_sb_append(&p.b, "\n", 1);
    spill(&p, 0);
    gcd_sb_free(&p.b);
    return p.ok;
}

// ----------------------------------------------------------------------------
// the renderings' view of a report: every string value as a terminal may show it (gcd_sb_term), so that
// no name or message can start a line, move a cursor or break a document; keys are only looked up

static int any_unsafe(const cJSON *v) {
    for (; v; v = v->next) {
        if (cJSON_IsString(v) && v->valuestring && gcd_term_needs(v->valuestring)) return 1;
        if (v->child && any_unsafe(v->child)) return 1;
    }
    return 0;
}

static void make_safe(cJSON *v) {
    for (; v; v = v->next) {
        if (cJSON_IsString(v) && v->valuestring && gcd_term_needs(v->valuestring)) {
            char *t = gcd_term_str(v->valuestring);
            cJSON_free(v->valuestring);
            v->valuestring = cJSON_malloc(strlen(t) + 1);
            mallocCheck(v->valuestring);
            memcpy(v->valuestring, t, strlen(t) + 1);
            free(t);
        }
        if (v->child) make_safe(v->child);
    }
}

const cJSON *gcd_report_safe(const cJSON *doc, cJSON **copy) {
    *copy = NULL;
    if (!doc || !any_unsafe(doc->child)) return doc;   // the usual case: nothing copied
    *copy = cJSON_Duplicate(doc, 1);
    mallocCheck(*copy);
    make_safe((*copy)->child);
    return *copy;
}

// ----------------------------------------------------------------------------
// where a report goes: the path walked one name at a time from a directory descriptor, so that what is
// checked is what is written. A link is followed only when nobody else could have planted it: owned by
// this user or root, in a directory no other user controls (the kernel's protected_symlinks rule, made
// to hold in every directory: root never follows a link another user placed into a file root owns).

typedef struct {
    int dirfd;                 // the directory the last name is in
    char base[NAME_MAX + 1];   // the last name
    int magic;                 // a /proc fd link (/dev/stdout, /dev/fd/N): only the kernel can follow it
    int exists;                // base is there (lstat'ed into st)
    struct stat st;
} place;

// another user can add, remove or swap names in directory d
static int others_control(const struct stat *d) {
    uid_t me = geteuid();
    return (d->st_uid != me && d->st_uid != 0) || ((d->st_mode & (S_IWGRP | S_IWOTH)) && !(d->st_mode & S_ISVTX));
}

static int on_procfs(int fd) {
    struct statfs s;
    return fstatfs(fd, &s) == 0 && s.f_type == PROC_SUPER_MAGIC;
}

static int failed(char *err, size_t len, const char *what, const char *path, int e) {
    snprintf(err, len, "%s: cannot write %s: %s", what, path, strerror(e ? e : EIO));
    return -1;
}

// Walks path to its last name. 0: *out (the caller closes out->dirfd); -2: refused (a link someone else
// controls: bad input); -1: failed. err names the path as it was given.
static int walk(const char *what, const char *path, place *out, char *err, size_t len) {
    char rest[PATH_MAX * 2 + 2], name[NAME_MAX + 1] = "";
    if (strlen(path) >= PATH_MAX) return failed(err, len, what, path, ENAMETOOLONG);
    snprintf(rest, sizeof rest, "%s", path);
    *out = (place){ .dirfd = -1 };
    int fd = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC), hops = 0;
    if (fd < 0) return failed(err, len, what, path, errno);
    const char *p = rest;
    for (;;) {
        while (*p == '/') p++;
        size_t n = strcspn(p, "/");
        int last = !p[n + strspn(p + n, "/")];
        if (!n) {
            close(fd);
            snprintf(err, len, "%s: %s is a directory", what, path);
            return -2;
        }
        if (n > NAME_MAX) return close(fd), failed(err, len, what, path, ENAMETOOLONG);
        memcpy(name, p, n), name[n] = 0;
        p += n;
        struct stat ln, dir;
        if (fstatat(fd, name, &ln, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT && last) break;   // a new file
            int e = errno;
            return close(fd), failed(err, len, what, path, e);
        }
        if (S_ISLNK(ln.st_mode)) {
            int theirs = ln.st_uid != geteuid() && ln.st_uid != 0;
            if (fstat(fd, &dir) != 0 || theirs || others_control(&dir)) {
                close(fd);
                snprintf(err, len, "%s: %s: '%s' is a link %s (uid %u): not followed; give the path it points to", what, path, name,
                         theirs ? "another user owns" : "in a directory another user controls", (unsigned)(theirs ? ln.st_uid : dir.st_uid));
                return -2;
            }
            if (last && on_procfs(fd)) {   // /proc/self/fd/1 reads "pipe:[123]": opened as it is
                out->magic = 1;
                break;
            }
            char target[PATH_MAX], tail[PATH_MAX * 2 + 2];
            ssize_t k = readlinkat(fd, name, target, sizeof target - 1);
            if (k <= 0 || ++hops > 40 || (size_t)k + strlen(p) + 1 >= sizeof rest) {
                int e = k <= 0 ? errno : ELOOP;
                return close(fd), failed(err, len, what, path, e);
            }
            target[k] = 0;
            size_t nt = strlen(p);
            memcpy(tail, p, nt + 1);
            memcpy(rest, target, (size_t)k), memcpy(rest + k, tail, nt + 1);
            p = rest;
            if (target[0] == '/') {
                close(fd);
                if ((fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) return failed(err, len, what, path, errno);
            }
            continue;
        }
        if (last && !S_ISDIR(ln.st_mode)) {
            out->exists = 1, out->st = ln;
            break;
        }
        if (last) {
            close(fd);
            snprintf(err, len, "%s: %s is a directory", what, path);
            return -2;
        }
        int next = openat(fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            int e = errno;
            close(fd);
            if (e != ELOOP) return failed(err, len, what, path, e);
            snprintf(err, len, "%s: %s: '%s' became a link while it was opened: not followed", what, path, name);
            return -2;
        }
        close(fd);
        fd = next;
    }
    out->dirfd = fd;
    memcpy(out->base, name, sizeof name);
    return 0;
}

int gcd_output_check(const char *what, const char *path, char *err, size_t len) {
    if (!strcmp(path, "-")) return 0;
    place pl;
    int rc = walk(what, path, &pl, err, len);
    if (rc) return rc;   // a FIFO is not opened here: a reader would take our close for the end of the report
    close(pl.dirfd);
    return rc;
}

// where path ends up: the same (st_dev, st_ino) for what exists, the directory's and the last name's for
// what does not yet; "-" is stdout. 0 when it cannot be told (the writer reports that)
int gcd_output_identity(const char *path, gcd_output_id *id) {
    *id = (gcd_output_id){ 0 };
    struct stat st;
    if (!strcmp(path, "-")) {
        if (fstat(1, &st)) return 0;
        return id->dev = st.st_dev, id->ino = st.st_ino, 1;
    }
    place pl;
    char err[64];
    if (walk("", path, &pl, err, sizeof err)) return 0;
    int ok = pl.magic ? fstatat(pl.dirfd, pl.base, &st, 0) == 0 : pl.exists ? 1 : fstat(pl.dirfd, &st) == 0;
    if (pl.exists && !pl.magic) st = pl.st;
    if (ok) id->dev = st.st_dev, id->ino = st.st_ino;
    if (ok && !pl.exists && !pl.magic) snprintf(id->name, sizeof id->name, "%s", pl.base);   // not there yet: the directory and the name
    close(pl.dirfd);
    return ok;
}

int gcd_output_same(const char *a, const char *b) {
    gcd_output_id x, y;
    if (!strcmp(a, b)) return 1;
    if (!gcd_output_identity(a, &x) || !gcd_output_identity(b, &y)) return 0;
    return x.dev == y.dev && x.ino == y.ino && !strcmp(x.name, y.name);
}

// ----------------------------------------------------------------------------
// writing: whole or not at all

#define WAIT_FOR_READER_MS 60000   // a pipe or FIFO whose reader takes nothing for this long: the write fails
#define WAIT_FOR_OPEN_MS 10000     // a FIFO that nobody opens for reading for this long: the same

// writes to fd; a pipe's reader that stalls for a minute ends the write (the fd is non-blocking)
typedef struct { int fd; } sink;

static ssize_t sink_write(void *c, const char *buf, size_t n) {
    sink *s = c;
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(s->fd, buf + done, n - done);
        if (k > 0) { done += (size_t)k; continue; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) {
            struct pollfd pf = { s->fd, POLLOUT, 0 };
            int r = poll(&pf, 1, WAIT_FOR_READER_MS);
            if (r > 0 && !(pf.revents & (POLLERR | POLLHUP))) continue;
            errno = r == 0 ? ETIMEDOUT : pf.revents & POLLHUP ? EPIPE : EIO;
        }
        return done ? (ssize_t)done : -1;
    }
    return (ssize_t)done;
}

static int sink_close(void *c) {
    (void)c;
    return 0;
}

// Straight into an open descriptor: stdout, a device, a FIFO, a /proc fd link. ENOSPC, short writes
// and a reader that stalls are errors.
static int emit(const cJSON *doc, const char *text, FILE *f) { return doc ? print_to(doc, f) : !text || fputs(text, f) >= 0; }

static int write_fd(const cJSON *doc, const char *text, int fd) {
    sink s = { fd };
    FILE *f = fopencookie(&s, "w", (cookie_io_functions_t){ .write = sink_write, .close = sink_close });
    if (!f) return 0;
    errno = 0;
    int ok = emit(doc, text, f) && fflush(f) == 0;
    int saved = errno;
    ok &= fclose(f) == 0;
    errno = saved;
    return ok;
}

static int write_stdout(const cJSON *doc, const char *text) {
    errno = 0;
    int ok = emit(doc, text, stdout) && fflush(stdout) == 0 && !ferror(stdout);
    if (!ok && !errno) errno = EIO;
    return ok;
}

// A writer killed mid-write leaves NAME.tmp.XXXXXX: the next write of NAME removes those over an hour
// old (exactly that name pattern, regular files only, never a fresh one: it may be another writer's)
static void remove_stale_temporaries(int dirfd, const char *stem) {
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d && fd >= 0) close(fd);
    size_t nb = strlen(stem);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        struct stat st;
        if (strncmp(n, stem, nb) || strncmp(n + nb, ".tmp.", 5) || strlen(n + nb + 5) != 6) continue;
        if (fstatat(dirfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && time(NULL) - st.st_mtime > 3600) unlinkat(dirfd, n, 0);
    }
    if (d) closedir(d);
}

// a new temporary beside base, created by this process alone (O_EXCL, no link followed), 0600
static int make_temporary(int dirfd, const char *stem, char *tmp, size_t len) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int tries = 0; tries < 100; tries++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != sizeof r)
            for (int i = 0; i < 6; i++) r[i] = (unsigned char)(rand() ^ getpid() ^ (int)time(NULL));
        snprintf(tmp, len, "%s.tmp.%c%c%c%c%c%c", stem, abc[r[0] % 62], abc[r[1] % 62], abc[r[2] % 62], abc[r[3] % 62], abc[r[4] % 62], abc[r[5] % 62]);
        int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

static int write_file(const cJSON *doc, const char *text, const char *what, const char *path, char *err, size_t len);

int gcd_report_write(const cJSON *doc, const char *path, char *err, size_t len) {
    return write_file(doc, NULL, "report", path, err, len);
}

int gcd_text_write(const char *text, const char *what, const char *path, char *err, size_t len) {
    return write_file(NULL, text, what, path, err, len);
}

// doc printed, or text as it is, into path: whole or not at all. 0, -1 failed, -2 refused (err says why)
static int write_file(const cJSON *doc, const char *text, const char *what, const char *path, char *err, size_t len) {
    if (!strcmp(path, "-")) return write_stdout(doc, text) ? 0 : failed(err, len, what, "to stdout", errno);
    place pl;
    int rc = walk(what, path, &pl, err, len);
    if (rc) return rc;
    if (pl.magic || (pl.exists && !S_ISREG(pl.st.st_mode))) {   // a device, a FIFO, stdout: never replaced, never removed
        int fd, waited = 0;   // a FIFO nobody opens for reading within WAIT_FOR_OPEN_MS: the write fails
        while ((fd = openat(pl.dirfd, pl.base, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (pl.magic ? O_APPEND : O_NOFOLLOW))) < 0 &&
               errno == ENXIO && waited < WAIT_FOR_OPEN_MS)
            poll(NULL, 0, 100), waited += 100;
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !pl.magic) {   // swapped for a file since: replaced as one, below
            close(fd);
            pl.exists = 1, pl.st = st;
        } else {
            int ok = fd >= 0 && write_fd(doc, text, fd), e = errno;
            if (fd >= 0) ok &= close(fd) == 0;
            close(pl.dirfd);
            if (fd < 0 && e == ENXIO) return snprintf(err, len, "%s: cannot write %s: a FIFO that nobody opened for reading in %d s", what, path, WAIT_FOR_OPEN_MS / 1000), -1;
            return ok ? 0 : failed(err, len, what, path, e);
        }
    }
    char stem[NAME_MAX + 1], tmp[NAME_MAX + 1];
    snprintf(stem, sizeof stem, "%.*s", NAME_MAX - 11, pl.base);   // a 255-byte name still has a temporary
    remove_stale_temporaries(pl.dirfd, stem);
    int fd = make_temporary(pl.dirfd, stem, tmp, sizeof tmp);
    if (fd < 0) return rc = errno, close(pl.dirfd), failed(err, len, what, path, rc);
    mode_t mask = umask(0);
    umask(mask);
    FILE *f = fdopen(fd, "w");
    errno = 0;
    int ok = f && emit(doc, text, f) && fflush(f) == 0 && fchmod(fd, 0666 & ~mask) == 0 && fsync(fd) == 0;   // a report is as any new file here
    int saved = errno;
    if (f) ok &= fclose(f) == 0;
    else close(fd);
    if (ok && renameat(pl.dirfd, tmp, pl.dirfd, pl.base) != 0) ok = 0, saved = errno;
    if (!ok) unlinkat(pl.dirfd, tmp, 0);
    close(pl.dirfd);
    return ok ? 0 : failed(err, len, what, path, saved);
}

// ----------------------------------------------------------------------------
// reading: a gradcheck-dist report of exactly the schema this build writes, every key the renderings
// read checked, and every number they turn into a count or an index within range. A bad key is named
// by its JSON path: runs[0].params[3].shape.

typedef struct {
    char *err;
    size_t len;
} why;

static int bad(why *w, const char *path, const char *key, const char *what) {
    snprintf(w->err, w->len, "%s%s%s: %s", path, *path && key ? "." : "", key ? key : "", what);
    return 0;
}

static const cJSON *key(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int need(why *w, const cJSON *o, const char *path, const char *k, cJSON_bool (*is)(const cJSON *)) {
    return is(key(o, k)) ? 1 : bad(w, path, k, "missing or of the wrong type");
}

// an integer in [lo, hi], or absent/null when optional
static int whole(why *w, const cJSON *o, const char *path, const char *k, double lo, double hi, int optional) {
    const cJSON *v = key(o, k);
    if (optional && (!v || cJSON_IsNull(v))) return 1;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        char what[96];
        snprintf(what, sizeof what, "expected a whole number from %.0f to %.0f", lo, hi);
        return bad(w, path, k, what);
    }
    return 1;
}

// shape: whole numbers whose product is at most 2^40 (null where a check's tensor has none); *n: the product
static int shape_ok(why *w, const cJSON *p, const char *path, double *n) {
    const cJSON *s = key(p, "shape"), *d;
    *n = 1;
    if (cJSON_IsNull(s)) return *n = -1, 1;
    if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > 8) return bad(w, path, "shape", "not an array of at most 8 whole numbers");
    cJSON_ArrayForEach(d, s) {
        if (!cJSON_IsNumber(d) || d->valuedouble != floor(d->valuedouble) || d->valuedouble < 0 || d->valuedouble > INT_MAX)
            return bad(w, path, "shape", "not an array of whole numbers from 0 to 2^31-1");
        *n *= d->valuedouble;
    }
    return *n <= 1099511627776.0 ? 1 : bad(w, path, "shape", "its element count is over 2^40");
}

static int number_ok(const cJSON *x) { return cJSON_IsNumber(x) || cJSON_IsString(x); }

// values: null, an array of n numbers (or "nan", "inf", "-inf"), or over the limit an elided tensor
// {"elided": true, "numel": n, "norm", "first": [at most GCD_VALUES_FIRST numbers]}
static int values_ok(why *w, const cJSON *v, const char *path, const char *k, double n) {
    if (!v || cJSON_IsNull(v)) return 1;
    if (cJSON_IsObject(v)) {
        const cJSON *numel = key(v, "numel"), *first = key(v, "first"), *x;
        if (!cJSON_IsTrue(key(v, "elided")) || !cJSON_IsNumber(numel) || numel->valuedouble != n || !number_ok(key(v, "norm")) ||
            !cJSON_IsArray(first) || cJSON_GetArraySize(first) > GCD_VALUES_FIRST || cJSON_GetArraySize(first) > n)
            return bad(w, path, k, "not an elided tensor {elided: true, numel: as many values as the shape holds, norm, first: at most 16 values}");
        cJSON_ArrayForEach(x, first) if (!number_ok(x)) return bad(w, path, k, "holds a value that is not a number");
        return 1;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n) return bad(w, path, k, "not an array of as many values as the shape holds");
    const cJSON *x;
    cJSON_ArrayForEach(x, v) if (!number_ok(x)) return bad(w, path, k, "holds a value that is not a number");
    return 1;
}

// a probe's setup: {params: [{name, shape, init}], inputs: [{rank, tensors: [{name, shape, data}]}]}
static int setup_ok(why *w, const cJSON *s, const char *path) {
    if (!cJSON_IsObject(s)) return bad(w, path, NULL, "not an object");
    if (!need(w, s, path, "params", cJSON_IsArray) || !need(w, s, path, "inputs", cJSON_IsArray)) return 0;
    char at[192];
    const cJSON *p, *r, *t;
    int i = 0;
    cJSON_ArrayForEach(p, key(s, "params")) {
        double n;
        snprintf(at, sizeof at, "%s.params[%d]", path, i++);
        if (!cJSON_IsObject(p) || !need(w, p, at, "name", cJSON_IsString) || !shape_ok(w, p, at, &n) || !values_ok(w, key(p, "init"), at, "init", n)) return 0;
    }
    i = 0;
    cJSON_ArrayForEach(r, key(s, "inputs")) {
        snprintf(at, sizeof at, "%s.inputs[%d]", path, i++);
        if (!cJSON_IsObject(r) || !need(w, r, at, "tensors", cJSON_IsArray)) return bad(w, at, "tensors", "missing or of the wrong type");
        int j = 0;
        cJSON_ArrayForEach(t, key(r, "tensors")) {
            double n;
            char tat[224];
            snprintf(tat, sizeof tat, "%s.tensors[%d]", at, j++);
            if (!cJSON_IsObject(t) || !need(w, t, tat, "name", cJSON_IsString) || !shape_ok(w, t, tat, &n) || !values_ok(w, key(t, "data"), tat, "data", n)) return 0;
        }
    }
    return 1;
}

static int run_ok(why *w, const cJSON *run, const char *path, int world) {
    if (!cJSON_IsObject(run)) return bad(w, path, NULL, "not an object");
    int check = cJSON_IsString(key(run, "probe")) && !strcmp(key(run, "probe")->valuestring, "check");
    if (!(need(w, run, path, "probe", cJSON_IsString) && need(w, run, path, "mode", cJSON_IsString) && need(w, run, path, "params", cJSON_IsArray) &&
          need(w, run, path, "findings", cJSON_IsArray) && whole(w, run, path, "world", 1, 65536, 0) &&
          (check ? need(w, run, path, "dumps", cJSON_IsArray) : need(w, run, path, "loss", cJSON_IsObject) && whole(w, run, path, "steps", 0, 1e6, 0))))
        return 0;
    int W = (int)key(run, "world")->valuedouble;
    if (W != world) return bad(w, path, "world", "differs from environment.world");
    char at[160];
    snprintf(at, sizeof at, "%s.setup", path);
    if (key(run, "setup") && !setup_ok(w, key(run, "setup"), at)) return 0;   // schema /1
    if (!check) {
        const cJSON *loss = key(run, "loss"), *row;
        snprintf(at, sizeof at, "%s.loss", path);
        if (!need(w, loss, at, "per_rank", cJSON_IsArray) || !need(w, loss, at, "per_step", cJSON_IsArray)) return 0;
        if (!values_ok(w, key(loss, "per_rank"), at, "per_rank", W)) return 0;
        int s = 0;
        cJSON_ArrayForEach(row, key(loss, "per_step")) {
            snprintf(at, sizeof at, "%s.loss.per_step[%d]", path, s++);
            if (!values_ok(w, row, at, "", W)) return 0;
        }
    }
    const cJSON *p, *f;
    int i = 0;
    cJSON_ArrayForEach(p, key(run, "params")) {
        snprintf(at, sizeof at, "%s.params[%d]", path, i++);
        double n;
        if (!cJSON_IsObject(p)) return bad(w, at, NULL, "not an object");
        if (!(need(w, p, at, "name", cJSON_IsString) && need(w, p, at, "status", cJSON_IsString) && shape_ok(w, p, at, &n) &&
              whole(w, p, at, "ranks_with_grad", 0, W, 0) && whole(w, p, at, "nonfinite", 0, 9e15, 0)))
            return 0;
        if (!values_ok(w, key(p, "reduced"), at, "reduced", n) || !values_ok(w, key(p, "reference"), at, "reference", n)) return 0;
        const cJSON *local = key(p, "local"), *r;
        if (local && !cJSON_IsNull(local)) {
            if (!cJSON_IsArray(local) || cJSON_GetArraySize(local) != W) return bad(w, at, "local", "not an array of one entry per rank");
            cJSON_ArrayForEach(r, local) if (!values_ok(w, r, at, "local[]", n)) return 0;
        }
    }
    i = 0;
    cJSON_ArrayForEach(f, key(run, "findings")) {
        snprintf(at, sizeof at, "%s.findings[%d]", path, i++);
        if (!cJSON_IsObject(f) || !need(w, f, at, "kind", cJSON_IsString) || !need(w, f, at, "message", cJSON_IsString)) return 0;
    }
    return 1;
}

static int doc_ok(why *w, const cJSON *doc) {
    const cJSON *schema = key(doc, "schema");
    const char *prefix = "gradcheck-dist.report/";
    if (!cJSON_IsObject(doc)) return bad(w, "", NULL, "not a gradcheck-dist report (not a JSON object)");
    if (!cJSON_IsString(schema) || strncmp(schema->valuestring, prefix, strlen(prefix))) {
        snprintf(w->err, w->len, "not a gradcheck-dist report (no \"schema\": \"%s\")", GCD_REPORT_SCHEMA);
        return 0;
    }
    const char *v = schema->valuestring + strlen(prefix);   // /1 to this build's: read; a later one: newer; "/-1", "/x": nothing known
    int number = *v >= '1' && *v <= '9' && v[strspn(v, "0123456789")] == 0 && strlen(v) < 6, version = number ? atoi(v) : 0;
    if (version < GCD_REPORT_VERSION_OLDEST || version > GCD_REPORT_VERSION) {
        snprintf(w->err, w->len, number ? "schema %.40s is newer than this gradcheck-dist (%s) reads: upgrade it" : "schema %.40s is not one this gradcheck-dist (%s) knows",
                 schema->valuestring, GCD_VERSION);
        return 0;
    }
    if (!(need(w, doc, "", "environment", cJSON_IsObject) && need(w, doc, "", "runs", cJSON_IsArray) && need(w, doc, "", "result", cJSON_IsString) &&
          whole(w, doc, "", "exit_code", 0, 3, 0) && need(w, doc, "", "expectations", cJSON_IsArray) && need(w, doc, "", "command", cJSON_IsArray) &&
          whole(w, key(doc, "environment"), "environment", "world", 1, 65536, 0)))
        return 0;
    int world = (int)key(key(doc, "environment"), "world")->valuedouble, i = 0;
    static const char *const lists[] = { "hostnames", "devices" };   // one per rank at most: the renderings count them
    for (int k = 0; k < 2; k++) {
        const cJSON *l = key(key(doc, "environment"), lists[k]), *x;
        if (!l || cJSON_IsNull(l)) continue;
        if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) > world) return bad(w, "environment", lists[k], "not an array of at most one string per rank (environment.world)");
        cJSON_ArrayForEach(x, l) if (!cJSON_IsString(x)) return bad(w, "environment", lists[k], "holds something that is not a string");
    }
    const cJSON *run, *e, *setups = key(doc, "setups");
    if (setups && !cJSON_IsArray(setups)) return bad(w, "", "setups", "not an array");
    cJSON_ArrayForEach(e, setups) {
        char at[32];
        snprintf(at, sizeof at, "setups[%d]", i++);
        if (!setup_ok(w, e, at) || !need(w, e, at, "probe", cJSON_IsString)) return 0;
    }
    i = 0;
    cJSON_ArrayForEach(run, key(doc, "runs")) {
        char at[32];
        snprintf(at, sizeof at, "runs[%d]", i++);
        if (!run_ok(w, run, at, world)) return 0;
    }
    i = 0;
    cJSON_ArrayForEach(e, key(doc, "expectations")) {
        char at[40];
        snprintf(at, sizeof at, "expectations[%d]", i++);
        if (!cJSON_IsObject(e) || !need(w, e, at, "message", cJSON_IsString)) return 0;
    }
    const cJSON *err = key(doc, "error");
    if (cJSON_IsObject(err) && !(need(w, err, "error", "message", cJSON_IsString) && whole(w, err, "error", "rank", 0, 65535, 0))) return 0;
    return 1;
}

static int oom;   // cJSON's allocations, watched: "out of memory" is not "not valid JSON"
static void *watched_malloc(size_t n) {
    void *p = malloc(n);
    oom |= !p;
    return p;
}

// What the tree of buf costs: one cJSON node (64 bytes, 80 with malloc's header) per value, and the
// text of every string and key once more. A report of "0," x N costs 40 times its size.
static double tree_bytes(const char *buf, size_t n, double *values) {
    double v = 1;
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') in_string = 1;
        else if (c == ',' || c == '[' || c == '{') v++;
    }
    *values = v;
    return v * 80.0 + (double)n;
}

// the memory this process may still take: the cgroup's limit less its use, the address-space limit,
// the machine's available memory; the least of them (bytes, or INFINITY when none is known)
static double memory_left(void) {
    double left = INFINITY;
    char line[256];
    unsigned long long a, b;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f && fscanf(f, "%llu", &a) == 1) {
        FILE *g = fopen("/sys/fs/cgroup/memory.current", "r");
        if (g && fscanf(g, "%llu", &b) == 1) left = a > b ? (double)(a - b) : 0;
        if (g) fclose(g);
    }
    if (f) fclose(f);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < left) left = (double)rl.rlim_cur;
    if ((f = fopen("/proc/meminfo", "r"))) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &a) == 1 && a * 1024.0 < left) left = a * 1024.0;
        fclose(f);
    }
    return left;
}

cJSON *gcd_report_parse(const char *buf, size_t n, const char *name, char *err, size_t len) {
    if (!n || memchr(buf, 0, n)) return snprintf(err, len, "%s: not a gradcheck-dist report (empty or binary)", name), NULL;
    double values, cost = tree_bytes(buf, n, &values), left = memory_left();
    if (cost > GCD_REPORT_MAX_TREE || cost > left) {   // refused before a byte of the tree is built
        snprintf(err, len, "%s: %.0f JSON values: reading it would take about %.1f GB of memory, over the %.1f GB %s", name, values, cost / 1e9,
                 (cost > GCD_REPORT_MAX_TREE ? GCD_REPORT_MAX_TREE : left) / 1e9,
                 cost > GCD_REPORT_MAX_TREE ? "a report may take (write a large one with --summary-only, or without --full)" : "this process may still use here");
        errno = cost > GCD_REPORT_MAX_TREE ? EFBIG : ENOMEM;
        return NULL;
    }
    cJSON_Hooks hooks = { watched_malloc, free };
    cJSON_InitHooks(&hooks);
    oom = 0;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!doc) {
        size_t at = end ? (size_t)(end - buf) : 0;
        if (oom) snprintf(err, len, "%s: out of memory reading it (%zu bytes)", name, n), errno = ENOMEM;
        else snprintf(err, len, "%s: not valid JSON (%s at byte %zu of %zu)", name, at >= n ? "ends early: truncated?" : "syntax error", at, n);
        return NULL;
    }
    for (const char *s = end; s < buf + n; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') {
            snprintf(err, len, "%s: not valid JSON (bytes after the report at byte %zu)", name, (size_t)(s - buf));
            cJSON_Delete(doc);
            return NULL;
        }
    char why_buf[512] = "";
    why w = { why_buf, sizeof why_buf };
    if (!doc_ok(&w, doc)) {
        snprintf(err, len, "%s: %s", name, why_buf);
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

cJSON *gcd_report_load(const char *path, char *err, size_t len) {
    int std = !strcmp(path, "-");
    int fd = std ? 0 : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);   // a FIFO must not block the open
    if (fd < 0) return snprintf(err, len, "%s: %s", path, strerror(errno)), NULL;
    struct stat st;
    if (!std && (fstat(fd, &st) || !S_ISREG(st.st_mode))) {
        close(fd);
        return snprintf(err, len, "%s: not a regular file (give a report file, or - for stdin)", path), NULL;
    }
    if (!std && (uint64_t)st.st_size > GCD_REPORT_MAX_BYTES) {
        close(fd);
        return snprintf(err, len, "%s: %lld bytes, over the %llu a report may have", path, (long long)st.st_size, (unsigned long long)GCD_REPORT_MAX_BYTES), NULL;
    }
    gcd_sb b = { 0 };
    char chunk[65536];
    ssize_t k;
    int rc = 0;
    while ((k = read(fd, chunk, sizeof chunk)) != 0) {
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k < 0) { rc = errno; break; }
        if (b.len + (size_t)k > GCD_REPORT_MAX_BYTES) { rc = EFBIG; break; }
        gcd_sb_append(&b, chunk, (size_t)k);
    }
    if (!std) close(fd);
    cJSON *doc = NULL;
    if (rc == EFBIG) snprintf(err, len, "%s: over the %llu bytes a report may have", path, (unsigned long long)GCD_REPORT_MAX_BYTES);
    else if (rc) snprintf(err, len, "%s: read error: %s", path, strerror(rc));
    else doc = gcd_report_parse(b.s ? b.s : "", b.len, path, err, len);
    int saved = errno;   // ENOMEM: the machine's limit, not the file's fault
    gcd_sb_free(&b);
    errno = saved;
    return doc;
}
