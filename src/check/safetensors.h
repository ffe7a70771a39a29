/*
 * safetensors: a strict reader for gradient dumps. A file is an 8-byte little-endian header length N,
 * N bytes of JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {string: string}}), then the
 * data. Every header field and offset is validated before any data is touched: the tensors must tile
 * the data exactly (no overlap, hole or trailing byte), each one dtype size x shape long. The data is
 * mapped (mmap) or, where mapping fails, read with pread one chunk at a time; either way memory stays
 * O(chunk). Errors name the file and the tensor and are the caller's exit 2.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define GCD_ST_MAX_DIM 8
#define GCD_ST_MAX_HEADER (100u << 20)   // 100 MB, as the safetensors library

typedef enum { GCD_DT_F64, GCD_DT_F32, GCD_DT_F16, GCD_DT_BF16, GCD_DT_OTHER } gcd_dtype;

typedef struct {
    char *name;
    char dtype_name[16];        // as written ("F32"); truncated when longer
    gcd_dtype dtype;            // GCD_DT_OTHER: not readable (size unknown unless a known safetensors dtype)
    int ndim;
    int64_t shape[GCD_ST_MAX_DIM];
    uint64_t n;                 // elements
    uint64_t begin, end;        // bytes, relative to the start of the data
} gcd_st_tensor;

typedef struct {
    char *path;
    int fd;                     // -1 once closed, and once mapped (the mapping holds the file)
    int open_errno;             // gcd_st_open: open(2)'s errno when it failed (EMFILE: a limit, not bad input)
    const unsigned char *map;   // the whole file, or NULL (pread fallback)
    uint64_t size;              // bytes, from fstat at open
    uint64_t data_start;        // 8 + N
    dev_t dev;
    ino_t ino;
    int64_t mtime_ns;
    int ntensor;
    gcd_st_tensor *tensor;      // (ntensor) in header order
    gcd_st_tensor **by_name;    // (ntensor) the same, sorted by name: gcd_st_find's index
    int nmeta;
    char **meta_key, **meta_val;   // (nmeta)
} gcd_st_file;

size_t gcd_dtype_size(gcd_dtype d);
const char *gcd_dtype_str(gcd_dtype d);

// Validates the 8-byte prefix and the header against a file of file_size bytes and fills f (its path
// must be set). Returns 0, or -1 with "PATH: ..." in err. This is the whole parser: the fuzz target
// calls it on raw bytes.
int gcd_st_parse(gcd_st_file *f, const unsigned char *header, uint64_t header_len, uint64_t file_size, char *err, size_t len);
// Opens and validates path; maps the data when it can. Returns 0, or -1 with "PATH: ..." in err.
int gcd_st_open(gcd_st_file *f, const char *path, char *err, size_t len);
// Rewrites every tensor's name in place with fn (which may only shorten it) and sorts the index again.
// Returns a name two tensors now share, or NULL.
const char *gcd_st_rename(gcd_st_file *f, void (*fn)(char *name));
// The value of metadata key, or NULL.
const char *gcd_st_meta(const gcd_st_file *f, const char *key);
// A tensor by name, or NULL.
const gcd_st_tensor *gcd_st_find(const gcd_st_file *f, const char *name);
// The raw little-endian bytes of count elements of t from element `at` (t's dtype must be readable):
// a pointer into the mapped file, or into a per-thread buffer filled by pread (valid until the next
// call). NULL with err set when the file shrank or a read failed; a mapped file that shrinks raises
// SIGBUS instead (see gcd_st_jmp).
const unsigned char *gcd_st_bytes(const gcd_st_file *f, const gcd_st_tensor *t, uint64_t at, size_t count, char *err, size_t len);
// Done with t: its mapped pages leave this process's resident set (they stay in the page cache).
void gcd_st_release(const gcd_st_file *f, const gcd_st_tensor *t);
extern const float gcd_f16_table[65536];   // F16 bits -> float, every value exact (f16.c)
// Has the file changed since it was opened (size, inode, mtime)? Returns 0, or -1 with err set.
int gcd_st_unchanged(const gcd_st_file *f, char *err, size_t len);
// Unmaps, closes and frees. A file filled by gcd_st_parse alone must have fd = -1 (a zeroed struct's
// fd 0 is stdin).
void gcd_st_close(gcd_st_file *f);

// SIGBUS on a mapped file that shrank under us: install the handler, point gcd_st_jmp (this thread's)
// at a sigsetjmp buffer, and a SIGBUS returns there with 1; set it back to NULL after the reads.
#include <setjmp.h>
extern _Thread_local sigjmp_buf *gcd_st_jmp;
void gcd_st_guard_install(void);
