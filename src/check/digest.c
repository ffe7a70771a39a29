#define _GNU_SOURCE   // sched_getaffinity, CPU_COUNT
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY   // XXH3_state_t in place
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>   // XXH3_128bits_update: AVX2 or AVX-512 where the CPU has it (chosen at run time)
#endif
#include "check/internal.h"

// ----------------------------------------------------------------------------
// The XXH3-128 of every file (what `xxh128sum` prints; a sha256 runs at a seventh of memory's speed).
// It names the dumps a report was made from; it is not a signature. A digest is sequential within a file.
// A mapped file whose tensors the scan reads in the order they lie in it is hashed by the scan itself,
// each chunk as it is read (hash_to: while the chunk is in cache, so the file comes from memory once).
// The other files go to a pool of threads, one file at a time each: as many threads as the CPUs this
// process may run on, at most one per file.

typedef struct {
    gcd_check_set *set;
    const unsigned char *inl;   // (world + 1) 1: hashed by the scan, not by the pool
    atomic_int next;       // the next file to take: 0..world, the reference last
    atomic_int failed;     // set with err: the other threads stop before their next file
    pthread_mutex_t mu;    // err's one writer
    char err[512];
} hash_job;


static void hash_failed(hash_job *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hash_failed(hash_job *h, const char *fmt, ...) {
    pthread_mutex_lock(&h->mu);
    if (!h->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(h->err, sizeof h->err, fmt, ap);
        va_end(ap);
    }
    atomic_store(&h->failed, 1);
    pthread_mutex_unlock(&h->mu);
}

static int hash_threads(int files) {
    cpu_set_t cpus;
    int n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    return n < files ? (n > 1 ? n : 1) : files;
}

static void *hash_files(void *arg) {
    hash_job *h = arg;
    gcd_check_set *set = h->set;
    size_t cap = 1 << 20;
    unsigned char *buf = gcd_malloc(cap);
    const gcd_st_file *volatile f = NULL;
    sigjmp_buf jb;
    gcd_st_guard_install();
    gcd_st_jmp = &jb;   // this thread's own guard: a mapped file that shrinks while it is hashed
    if (sigsetjmp(jb, 1)) {
        hash_failed(h, "%s: changed while being read (truncated: SIGBUS while hashing it); dump it again", f->path);
        goto out;
    }
    for (int k; !atomic_load(&h->failed) && (k = atomic_fetch_add(&h->next, 1)) < all_files(set);) {
        char *digest = k < nfiles(set) ? set->digest[k] : set->local_digest[k - nfiles(set)];
        f = every_file(set, k);
        if (!f) { digest[0] = 0; continue; }
        if (k < nfiles(set) && h->inl[k]) continue;
        XXH3_state_t s;
        XXH3_128bits_reset(&s);
        // from the mapping, no copy, and out of the resident set again piece by piece (16 MiB: page-aligned;
        // every hashing thread holds at most one piece)
        for (uint64_t at = 0, piece = 16u << 20; f->map && at < f->size; at += piece) {
            size_t n = f->size - at < piece ? (size_t)(f->size - at) : (size_t)piece;
            XXH3_128bits_update(&s, f->map + at, n);
            madvise((void *)(f->map + at), n, MADV_DONTNEED);
        }
        for (uint64_t at = 0; !f->map && at < f->size;) {
            ssize_t got = pread(f->fd, buf, cap, (off_t)at);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                hash_failed(h, "%s: %s while hashing it", f->path, got < 0 ? strerror(errno) : "the file shrank");
                goto out;
            }
            XXH3_128bits_update(&s, buf, (size_t)got);
            at += (uint64_t)got;
        }
        XXH128_hash_t d = XXH3_128bits_digest(&s);
        gcd_xxh128_hex(d.high64, d.low64, digest);
    }
out:
    gcd_st_jmp = NULL;
    free(buf);
    return NULL;
}


struct gcd_hash_pool {
    hash_job job;
    pthread_t *threads;
    int nthreads;
};

gcd_hash_pool *gcd_hash_pool_start(gcd_check_set *set, const unsigned char *inl, int pooled) {
    gcd_hash_pool *pool = gcd_malloc(sizeof *pool);
    *pool = (gcd_hash_pool){ .job = { .set = set, .inl = inl, .mu = PTHREAD_MUTEX_INITIALIZER } };
    int want = pooled ? hash_threads(pooled) : 0;
    pool->threads = gcd_malloc((size_t)(want ? want : 1) * sizeof *pool->threads);
    while (pool->nthreads < want && pthread_create(&pool->threads[pool->nthreads], NULL, hash_files, &pool->job) == 0) pool->nthreads++;
    if (!pool->nthreads && pooled) hash_files(&pool->job);
    return pool;
}

int gcd_hash_pool_join(gcd_hash_pool *pool, char *err, size_t len) {
    for (int i = 0; i < pool->nthreads; i++) pthread_join(pool->threads[i], NULL);
    int rc = pool->job.err[0] ? 2 : 0;
    if (rc && err) snprintf(err, len, "%s", pool->job.err);
    free(pool->threads), free(pool);
    return rc;
}
