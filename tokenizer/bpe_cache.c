/*
 * bpe_cache.c - the compact form of a loaded tokenizer.json or tiktoken
 * ranks file: the handle's tables (each id's bytes, the vocabulary and merge
 * hashes, the added tokens, the pre-tokenizer patterns) written once after a
 * parse and mapped on the next load instead of parsing again. A 128k-id
 * Llama 3 style tokenizer.json (9 MB, 280k merges) takes 0.2 s to parse and
 * build, o200k's ranks 35 ms; their cache files (mostly the hashes' empty
 * slots) map and check in a few milliseconds.
 *
 * Where: $TOKSHARD_CACHE_DIR, else $XDG_CACHE_HOME/tokshard, else
 * $HOME/.cache/tokshard (made mode 0700 when missing); TOKSHARD_CACHE_DIR=off
 * (or empty) turns it off, and a load with tks_tok_opts.no_cache (the audit
 * against the sources) neither reads nor writes it. One file per tokenizer, bpe-<key>.tkc: for a
 * tokenizer.json the XXH3-128 of its bytes (its tks_bpe_fingerprint), for a
 * ranks file the XXH3-128 of the ranks file's XXH3-128, the pattern and the
 * special tokens (bpe_tiktoken.c), everything its tables are made from.
 *
 * What the cache promises: the tables of an entry are the ones this user's
 * tokshard built from that tokenizer file, or the entry is not used.
 *   - The directory is used only when it is open and, on that descriptor,
 *     belongs to the user and no one else may write it (mode & 022 == 0);
 *     every file in it is opened relative to that descriptor with
 *     O_NOFOLLOW and checked on its own descriptor (regular, the user's, not
 *     writable by others), so no link or rename in between changes what is
 *     checked. Otherwise the cache is left unused and the handle says why
 *     (tks_bpe_cache_note: the tools print it once).
 *   - Entries are written under a new random name created exclusively
 *     (tks_write_file_at: O_EXCL, O_NOFOLLOW), then renamed: no link
 *     planted at a predictable name is ever written through, and readers
 *     see an old file or a complete new one.
 *   - Entries are bound to the user: `cache.key` in the directory holds 32
 *     random bytes made once (created exclusively, mode 0600, and read only
 *     when it is the user's, readable by no one else); from them a 192-byte
 *     XXH3 secret is derived (secret[16i..16i+16) = XXH3-128 of the key with
 *     seed i + 1), and the header and the body each carry their XXH3-128
 *     under that secret. An entry edited, or copied from another user or
 *     machine (another key), fails the check and is rebuilt from the
 *     tokenizer file. This detects edits and entries from elsewhere; it is
 *     not a cryptographic MAC: someone who holds the key (the user, root)
 *     can forge an entry.
 * tks_bpe_tables_xxh3 is the XXH3-128 of this form of a handle's tables
 * (the header's table fields, from `mode` to `norm`, then the body), taken
 * from the tables the handle encodes with, parsed or mapped: a dataset's
 * manifest records it, the same for both, and another value for tables
 * that differ, whoever made the entry.
 * The other checks: the header's magic, format, this build's identity
 * (TKS_BPE_CACHE_ID: a hash CMake takes of the sources that make and read
 * the tables, so another tokshard, or this one changed, never reads it),
 * utf8proc's version (added tokens are stored NFC-normalized), the key and
 * size of the file being loaded; the tables: every section inside the body,
 * every id and offset in range, the byte offsets increasing. The regexes
 * are compiled again at every load (PCRE2 is not asked to serialize its
 * code).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utf8proc.h>
#include <xxhash.h>

#include "tokenizer/bpe_internal.h"
#include "tokenizer/bpe_pcache.h"

#ifndef TKS_BPE_CACHE_ID
#define TKS_BPE_CACHE_ID "unversioned"
#endif

enum { CACHE_FORMAT = 6, N_SEC = 12, KEY_BYTES = 32, SECRET_BYTES = 192 };
static const char cache_magic[8] = {'T', 'K', 'S', 'B', 'P', 'E', 'C', 1};
static const char key_name[] = "cache.key";

/* The sections: per-id tables, the two hashes (no merges in rank mode), the
 * added tokens, the patterns, the ids that are no token (rank mode), the
 * seed table of the short tokens (bpe_pcache.h), the compact merge table
 * (empty without one). */
enum { S_OFF, S_BYTES, S_SPECIAL, S_VSLOT, S_MSLOT, S_RAW, S_NORM, S_TEXT, S_PAT, S_HOLE, S_SEED, S_MQ };

typedef struct cache_set {
    uint32_t n, one_first_plus1, max_len, pad;
    uint32_t first[257], pad2[3];
} cache_set;

typedef struct cache_split {
    uint32_t how, invert, opts, pad;
    uint64_t pat_off, pat_len; /* within section S_PAT */
} cache_split;

/* The header: the first sizeof(cache_header) bytes; the body follows. */
typedef struct cache_header {
    char magic[8];
    uint32_t format, header_size;
    char build_id[72];        /* TKS_BPE_CACHE_ID, NUL-padded */
    char utf8proc[16];        /* utf8proc_version() */
    uint8_t fingerprint[16];  /* the key (above) */
    uint64_t source_size;     /* the tokenizer.json's or the ranks file's bytes */
    uint64_t body_size;
    uint8_t body_check[16];   /* XXH3-128 of the body under the user's secret (canonical) */
    uint32_t mode, n_ids, n_model, nfc, ignore_merges, n_split;
    uint64_t vmask, mmask;
    uint32_t seed_bits, mq_id, mq_sub, mq_p;
    uint64_t mqmask;          /* 0: no compact merge table */
    uint32_t byte_id[256];
    struct {
        uint64_t off, len;
    } sec[N_SEC];              /* within the body, 64-byte aligned */
    cache_split split[TKS__BPE_MAX_SPLITS];
    cache_set raw, norm;
    uint8_t header_check[16];  /* XXH3-128 of every byte above under the user's secret (canonical) */
} cache_header;
_Static_assert(sizeof(cache_header) == offsetof(cache_header, header_check) + 16, "no byte after the check");

/* The cache directory in use: its descriptor (-1: none), its path, and the
 * secret derived from its key. */
typedef struct cache_at {
    int fd;
    char dir[4096];
    uint8_t secret[SECRET_BYTES];
} cache_at;

/* The cache directory's path into dir[cap]; 0 when caching is off or the
 * path is too long. */
static int cache_dir(char *dir, size_t cap) {
    const char *d = getenv("TOKSHARD_CACHE_DIR");
    int n;
    if (d) {
        if (!*d || !strcmp(d, "off")) return 0;
        n = snprintf(dir, cap, "%s", d);
    } else if ((d = getenv("XDG_CACHE_HOME")) && *d) {
        n = snprintf(dir, cap, "%s/tokshard", d);
    } else if ((d = getenv("HOME")) && *d) {
        n = snprintf(dir, cap, "%s/.cache/tokshard", d);
    } else {
        return 0;
    }
    return n > 0 && (size_t)n < cap;
}

/* Records on the handle why the cache directory is left unused: `why`
 * ends with ';' or with a first thing to do and "or": the other way out,
 * another directory, follows. */
static void cache_refused(tks_bpe *b, const char *dir, const char *why) {
    snprintf(b->cache_note, sizeof b->cache_note,
             "the tokenizer cache %.1024s is not used: %s set TOKSHARD_CACHE_DIR to a directory of your own "
             "(off: no cache)", dir, why);
}

/* Opens the cache directory into c->fd (creating it, mode 0700, when
 * `create`): 0, or 1 when there is none to use (caching off, missing, or
 * refused: then b->cache_note says why). Checked on the open descriptor:
 * the user's, and writable by no one else. */
static int open_dir(tks_bpe *b, int create, cache_at *c) {
    c->fd = -1;
    if (!cache_dir(c->dir, sizeof c->dir)) return 1;
    int fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", c->dir);
        char *sl = strrchr(parent, '/');
        tks_error keep = *tks_last_error();
        if (sl && sl != parent) *sl = 0, tks_mkdir_p(parent);
        tks_error_restore(&keep);
        mkdir(c->dir, 0700);
        fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    if (fd < 0) {
        if (errno != ENOENT) {
            char why[256];
            snprintf(why, sizeof why, "it cannot be opened (%s);", strerror(errno));
            cache_refused(b, c->dir, why);
        }
        return 1;
    }
    struct stat st;
    char why[256] = "";
    if (fstat(fd, &st) != 0)
        snprintf(why, sizeof why, "it cannot be examined (%s);", strerror(errno));
    else if (st.st_uid != geteuid())
        snprintf(why, sizeof why, "it belongs to user %lu, not to you (user %lu), and its owner could plant "
                 "entries or links in it;", (unsigned long)st.st_uid, (unsigned long)geteuid());
    else if (st.st_mode & 022)
        snprintf(why, sizeof why, "others may write it (mode %04o), and could plant entries or links in it; "
                 "make it yours alone with chmod go-w, or", (unsigned)(st.st_mode & 07777));
    if (why[0]) {
        close(fd);
        cache_refused(b, c->dir, why);
        return 1;
    }
    c->fd = fd;
    return 0;
}

/* The secret of the 32-byte key (the file comment gives the rule). */
static void derive_secret(const uint8_t key[KEY_BYTES], uint8_t secret[SECRET_BYTES]) {
    for (int i = 0; i < SECRET_BYTES / 16; i++) {
        XXH128_canonical_t cn;
        XXH128_canonicalFromHash(&cn, XXH3_128bits_withSeed(key, KEY_BYTES, (XXH64_hash_t)i + 1));
        memcpy(secret + 16 * i, cn.digest, 16);
    }
}

/* Makes the key file: 32 random bytes under a new name, linked to its name
 * only when there is none (so a reader sees no key or a whole one). 0, or 1
 * when another process made one first (read that one), or an error. */
static int make_key(cache_at *c) {
    uint8_t key[KEY_BYTES];
    char tmp[64];
    int fd, rc = tks_random(key, sizeof key);
    if (!rc) rc = tks_create_unique(c->fd, key_name, 0600, tmp, sizeof tmp, &fd);
    if (rc) return rc;
    rc = tks_pwrite_all(fd, key, sizeof key, 0, key_name);
    if (!rc && fsync(fd) != 0) rc = TKS_ERR_IO;
    close(fd);
    if (!rc && linkat(c->fd, tmp, c->fd, key_name, 0) != 0)
        rc = errno == EEXIST ? 1 : renameat(c->fd, tmp, c->fd, key_name) == 0 ? 0 : TKS_ERR_IO;
    unlinkat(c->fd, tmp, 0);
    if (!rc) derive_secret(key, c->secret);
    return rc;
}

/* The secret of the directory's key file into c->secret, the key made when
 * missing and `create`: 0, or 1 when there is none to use (then, when the
 * file is there but not a private file of the user's, b->cache_note says
 * why). */
static int cache_key(tks_bpe *b, cache_at *c, int create) {
    tks_error keep = *tks_last_error();
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = openat(c->fd, key_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            if (!create) return 1;
            int rc = make_key(c);
            tks_error_restore(&keep);
            if (rc == 1) continue; /* another process's key: read it */
            return rc ? 1 : 0;
        }
        struct stat st;
        uint8_t key[KEY_BYTES];
        char why[256] = "";
        if (fd < 0 && errno == ELOOP)
            snprintf(why, sizeof why, "its key %s is a symbolic link; remove it (a new key is made, and the "
                     "entries again), or", key_name);
        else if (fd < 0)
            snprintf(why, sizeof why, "its key %s cannot be opened (%s);", key_name, strerror(errno));
        else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) ||
                 st.st_size != KEY_BYTES || pread(fd, key, sizeof key, 0) != (ssize_t)sizeof key)
            snprintf(why, sizeof why, "its key %s is not a private file of yours (a regular file of %d bytes "
                     "that only you may read); remove it (a new key is made, and the entries again), or",
                     key_name, KEY_BYTES);
        if (fd >= 0) close(fd);
        if (why[0]) {
            cache_refused(b, c->dir, why);
            return 1;
        }
        derive_secret(key, c->secret);
        return 0;
    }
    return 1;
}

static void header_ids(cache_header *h) {
    memcpy(h->magic, cache_magic, sizeof h->magic);
    h->format = CACHE_FORMAT;
    h->header_size = (uint32_t)sizeof *h;
    snprintf(h->build_id, sizeof h->build_id, "%s", TKS_BPE_CACHE_ID);
    snprintf(h->utf8proc, sizeof h->utf8proc, "%s", utf8proc_version());
}

static void set_out(cache_set *c, const tks__bpe_added_set *s) {
    c->n = (uint32_t)s->n;
    c->one_first_plus1 = (uint32_t)(s->one_first + 1);
    c->max_len = s->max_len;
    memcpy(c->first, s->first, sizeof c->first);
}

/* The header's table fields (from `mode` to `norm`) of the handle b. */
static void header_tables(const tks_bpe *b, cache_header *h) {
    h->mode = (uint32_t)b->mode;
    h->n_ids = b->n_ids;
    h->n_model = b->n_model;
    h->nfc = (uint32_t)b->nfc;
    h->ignore_merges = (uint32_t)b->ignore_merges;
    h->n_split = (uint32_t)b->n_split;
    h->vmask = b->vmask;
    h->mmask = b->mode == TKS__BPE_MERGES ? b->mmask : 0;
    h->seed_bits = b->seed_bits;
    h->mqmask = b->mq ? b->mqmask : 0;
    h->mq_id = b->mq_id, h->mq_sub = b->mq_sub, h->mq_p = b->mq_p;
    memcpy(h->byte_id, b->byte_id, sizeof h->byte_id);
    set_out(&h->raw, &b->added_raw);
    set_out(&h->norm, &b->added_norm);
}

/* The file of b as pieces: pc[0] the header h (complete but for the
 * checks), then each section at a 64-byte boundary
 * (zero padding between); *np pieces. *pats (the caller frees it) holds the
 * patterns. 0, or -1 when out of memory. */
static int cache_pieces(const tks_bpe *b, cache_header *h, char **pats, tks_piece pc[1 + 2 * N_SEC], size_t *np) {
    header_ids(h);
    header_tables(b, h);
    size_t text_len = 0;
    for (size_t i = 0; i < b->added_raw.n; i++) text_len += b->added_raw.tok[i].len;
    for (size_t i = 0; i < b->added_norm.n; i++) text_len += b->added_norm.tok[i].len;
    size_t pat_len = 0;
    for (int i = 0; i < b->n_split; i++) {
        const tks__bpe_splitter *sp = &b->split[i];
        h->split[i] = (cache_split){(uint32_t)sp->how, (uint32_t)sp->invert, sp->opts, 0, pat_len, sp->pat_len};
        pat_len += sp->pat_len;
    }
    if (!(*pats = malloc(pat_len ? pat_len : 1))) return -1;
    for (int i = 0; i < b->n_split; i++) memcpy(*pats + h->split[i].pat_off, b->split[i].pat, b->split[i].pat_len);
    int merges = b->mode == TKS__BPE_MERGES;
    const void *data[N_SEC] = {b->off, b->bytes, b->special, b->vslot, b->mslot, b->added_raw.tok,
                               b->added_norm.tok, b->added_text, *pats, b->hole, b->seed, b->mq};
    size_t len[N_SEC] = {((size_t)b->n_ids + 1) * sizeof *b->off, b->off[b->n_ids], b->n_ids,
                         (b->vmask + 1) * sizeof *b->vslot, merges ? (b->mmask + 1) * sizeof *b->mslot : 0,
                         b->added_raw.n * sizeof *b->added_raw.tok, b->added_norm.n * sizeof *b->added_norm.tok,
                         text_len, pat_len, b->hole ? b->n_ids : 0, ((size_t)2 << b->seed_bits) * sizeof(pslot),
                         b->mq ? (b->mqmask + 1) * sizeof *b->mq : 0};
    static const char zeros[64];
    size_t n = 0, at = 0;
    pc[n++] = (tks_piece){h, sizeof *h};
    for (int s = 0; s < N_SEC; s++) {
        size_t pad = (64 - at % 64) % 64;
        if (pad) pc[n++] = (tks_piece){zeros, pad};
        at += pad;
        h->sec[s].off = at;
        h->sec[s].len = len[s];
        if (len[s]) pc[n++] = (tks_piece){data[s], len[s]};
        at += len[s];
    }
    h->body_size = at;
    *np = n;
    return 0;
}

/* The XXH3-128 (canonical) of the body pieces pc[1..np), under `secret`
 * when it is not NULL, after `head` bytes of the header h (0: none). */
static int digest(const cache_header *h, size_t head, const tks_piece *pc, size_t np, const uint8_t *secret,
                  uint8_t out[16]) {
    XXH3_state_t *x = XXH3_createState();
    if (!x) return -1;
    if (secret) XXH3_128bits_reset_withSecret(x, secret, SECRET_BYTES);
    else XXH3_128bits_reset(x);
    if (head) XXH3_128bits_update(x, &h->mode, head);
    for (size_t i = 1; i < np; i++) XXH3_128bits_update(x, pc[i].data, pc[i].size);
    XXH128_canonical_t cn;
    XXH128_canonicalFromHash(&cn, XXH3_128bits_digest(x));
    memcpy(out, cn.digest, 16);
    XXH3_freeState(x);
    return 0;
}

/* The bytes of the header that the tables' digest covers (mode .. norm). */
static size_t tables_head(void) { return offsetof(cache_header, header_check) - offsetof(cache_header, mode); }

/* The header's check under the secret (every byte before it). */
static void header_check(const cache_header *h, const uint8_t *secret, uint8_t out[16]) {
    XXH128_canonical_t cn;
    XXH128_canonicalFromHash(&cn, XXH3_128bits_withSecret(h, offsetof(cache_header, header_check), secret,
                                                          SECRET_BYTES));
    memcpy(out, cn.digest, 16);
}

void tks__bpe_cache_store(tks_bpe *b, const uint8_t key[16], size_t source_size) {
    if (b->cache_map || b->no_cache) return;
    cache_header *h = calloc(1, sizeof *h);
    char *pats = NULL;
    tks_piece pc[1 + 2 * N_SEC];
    size_t np = 0;
    if (!h || cache_pieces(b, h, &pats, pc, &np)) {
        free(pats);
        free(h);
        return; /* out of memory: no entry */
    }
    memcpy(h->fingerprint, key, 16);
    h->source_size = source_size;
    cache_at c;
    if (!open_dir(b, 1, &c) && !cache_key(b, &c, 1) && !digest(h, 0, pc, np, c.secret, h->body_check)) {
        header_check(h, c.secret, h->header_check);
        char hex[33], name[64];
        tks_hex(key, 16, hex);
        snprintf(name, sizeof name, "bpe-%s.tkc", hex);
        /* an entry that cannot be written costs the next load a parse, nothing more */
        tks_error keep = *tks_last_error();
        if (tks_write_file_at(c.fd, c.dir, name, pc, np, 0600)) tks_error_restore(&keep);
    }
    if (c.fd >= 0) close(c.fd);
    free(pats);
    free(h);
}

/* The checks of a mapped cache file against the tokenizer.json being
 * loaded, with the secret of the user's key; 1 when it may be used. */
static int cache_valid(const uint8_t *m, size_t size, const uint8_t fp[16], size_t source_size,
                       const uint8_t *secret) {
    if (size < sizeof(cache_header)) return 0;
    const cache_header *h = (const cache_header *)m;
    cache_header want;
    memset(&want, 0, sizeof want);
    header_ids(&want);
    if (memcmp(h->magic, want.magic, 8) || h->format != want.format || h->header_size != want.header_size ||
        memcmp(h->build_id, want.build_id, sizeof want.build_id) ||
        memcmp(h->utf8proc, want.utf8proc, sizeof want.utf8proc) || memcmp(h->fingerprint, fp, 16) ||
        h->source_size != source_size || h->body_size != size - sizeof *h)
        return 0;
    uint8_t check[16];
    header_check(h, secret, check);
    if (memcmp(check, h->header_check, 16)) return 0;
    const uint8_t *body = m + sizeof *h;
    tks_piece whole[2] = {{h, sizeof *h}, {body, h->body_size}};
    if (digest(h, 0, whole, 2, secret, check) || memcmp(check, h->body_check, 16)) return 0;
    /* the tables, as the encoder will read them */
    uint64_t n = h->n_ids;
    int merges = h->mode == TKS__BPE_MERGES;
    if ((!merges && h->mode != TKS__BPE_RANKS) || !n || h->n_model > n || h->n_split < 1 ||
        h->n_split > TKS__BPE_MAX_SPLITS || h->vmask > (1ull << 40) || (h->vmask & (h->vmask + 1)) ||
        h->mmask > (1ull << 40) || (h->mmask & (h->mmask + 1)) || (!merges && h->mmask) || h->seed_bits < 1 ||
        h->seed_bits > 40)
        return 0;
    uint64_t need[N_SEC] = {(n + 1) * 8, 0, n, (h->vmask + 1) * sizeof(tks__bpe_vslot),
                            merges ? (h->mmask + 1) * sizeof(tks__bpe_merge) : 0,
                            (uint64_t)h->raw.n * sizeof(tks__bpe_added), (uint64_t)h->norm.n * sizeof(tks__bpe_added),
                            0, 0, 0, ((uint64_t)2 << h->seed_bits) * sizeof(pslot),
                            h->mqmask ? (h->mqmask + 1) * 8 : 0};
    for (int s = 0; s < N_SEC; s++) {
        if (h->sec[s].off % 64 || h->sec[s].off > h->body_size || h->sec[s].len > h->body_size - h->sec[s].off)
            return 0;
        if (s == S_HOLE ? h->sec[s].len != 0 && h->sec[s].len != n
                        : s != S_BYTES && s != S_TEXT && s != S_PAT && h->sec[s].len != need[s])
            return 0;
    }
    const uint64_t *off = (const uint64_t *)(body + h->sec[S_OFF].off);
    if (off[0] != 0 || off[n] != h->sec[S_BYTES].len) return 0;
    for (uint64_t i = 0; i < n; i++)
        if (off[i + 1] < off[i]) return 0;
    for (int c = 0; c < 256; c++)
        if (h->byte_id[c] != TKS_NO_ID && h->byte_id[c] >= n) return 0;
    const tks__bpe_vslot *vs = (const tks__bpe_vslot *)(body + h->sec[S_VSLOT].off);
    for (uint64_t i = 0; i <= h->vmask; i++)
        if (vs[i].id != TKS_NO_ID && (vs[i].id >= h->n_model || vs[i].len != off[vs[i].id + 1] - off[vs[i].id]))
            return 0;
    const tks__bpe_merge *ms = (const tks__bpe_merge *)(body + h->sec[S_MSLOT].off);
    for (uint64_t i = 0; merges && i <= h->mmask; i++)
        if (ms[i].key && (ms[i].new_id >= n || ((ms[i].key - 1) >> 32) >= n || ((ms[i].key - 1) & 0xffffffffu) >= n))
            return 0;
    if (h->mqmask && (!merges || (h->mqmask & (h->mqmask + 1)) || h->mqmask > (1ull << 40) || !h->mq_id ||
                      h->mq_id > 31 || h->mq_p != h->mq_id + h->mq_sub + 1 || 2 * h->mq_id + h->mq_p > 64 ||
                      (1ull << h->mq_id) < n / 2))
        return 0;
    const uint64_t *mq = (const uint64_t *)(body + h->sec[S_MQ].off);
    for (uint64_t i = 0; h->mqmask && i <= h->mqmask; i++) {
        if (!mq[i]) continue;
        uint64_t key = mq[i] >> h->mq_p, pr = (mq[i] & ((1ull << h->mq_p) - 1)) - 1;
        if ((key >> h->mq_id) >= n || (key & ((1ull << h->mq_id) - 1)) >= n || (pr >> h->mq_sub) >= n) return 0;
    }
    const pslot *sd = (const pslot *)(body + h->sec[S_SEED].off);
    for (uint64_t i = 0; i < (uint64_t)2 << h->seed_bits; i++) {
        unsigned len = (unsigned)(sd[i].hi >> 56);
        if (!sd[i].lo && !sd[i].hi) continue;
        if (len < 1 || len > PKEY_MAX || sd[i].n < 1 || sd[i].n > PSLOT_IDS) return 0;
        for (uint32_t j = 0; j < sd[i].n; j++)
            if (sd[i].id[j] >= n) return 0;
    }
    const cache_set *sets[2] = {&h->raw, &h->norm};
    for (int k = 0; k < 2; k++) {
        const cache_set *cs = sets[k];
        const tks__bpe_added *a = (const tks__bpe_added *)(body + h->sec[k ? S_NORM : S_RAW].off);
        if (cs->first[0] != 0 || cs->first[256] != cs->n || cs->one_first_plus1 > 256) return 0;
        for (int c = 0; c < 256; c++)
            if (cs->first[c + 1] < cs->first[c]) return 0;
        for (uint32_t i = 0; i < cs->n; i++)
            if (a[i].id >= n || !a[i].len || a[i].len > cs->max_len || a[i].off > h->sec[S_TEXT].len ||
                a[i].len > h->sec[S_TEXT].len - a[i].off)
                return 0;
    }
    for (uint32_t i = 0; i < h->n_split; i++)
        if (h->split[i].how > B_CONTIGUOUS || h->split[i].pat_off > h->sec[S_PAT].len ||
            h->split[i].pat_len > h->sec[S_PAT].len - h->split[i].pat_off)
            return 0;
    return 1;
}

static void set_in(tks__bpe_added_set *s, const cache_set *c, const uint8_t *p) {
    s->tok = (tks__bpe_added *)p;
    s->n = c->n;
    s->one_first = (int)c->one_first_plus1 - 1;
    s->max_len = c->max_len;
    memcpy(s->first, c->first, sizeof s->first);
}

/* Maps the entry of key fp into *m, *size and checks it (cache_valid):
 * 0, or 1 when there is none to use. The entry is opened relative to the
 * checked directory, never through a link, and must be a regular file of
 * the user's that no one else may write: the tables decide every id. */
static int map_entry(tks_bpe *b, const uint8_t fp[16], size_t source_size, const uint8_t **m, size_t *size) {
    cache_at c;
    if (open_dir(b, 0, &c)) return 1;
    char hex[33], name[64];
    tks_hex(fp, 16, hex);
    snprintf(name, sizeof name, "bpe-%s.tkc", hex);
    int fd = openat(c.fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    void *p = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022) &&
        st.st_size >= (off_t)sizeof(cache_header) && !cache_key(b, &c, 0))
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    close(c.fd);
    if (p == MAP_FAILED) return 1;
    if (!cache_valid(p, (size_t)st.st_size, fp, source_size, c.secret)) {
        munmap(p, (size_t)st.st_size);
        return 1;
    }
    *m = p;
    *size = (size_t)st.st_size;
    return 0;
}

int tks__bpe_cache_load(tks_bpe *b, const uint8_t fp[16], size_t source_size) {
    const uint8_t *m;
    size_t size;
    if (b->no_cache || map_entry(b, fp, source_size, &m, &size)) return 1;
    const cache_header *h = (const cache_header *)m;
    uint8_t *body = (uint8_t *)m + sizeof *h;
    memcpy(b->fingerprint, fp, 16);
    b->mode = (tks__bpe_mode)h->mode;
    b->n_ids = h->n_ids;
    b->n_model = h->n_model;
    b->nfc = (int)h->nfc;
    b->ignore_merges = (int)h->ignore_merges;
    b->vmask = h->vmask;
    b->mmask = h->mmask;
    memcpy(b->byte_id, h->byte_id, sizeof b->byte_id);
    b->off = (uint64_t *)(body + h->sec[S_OFF].off);
    b->bytes = (char *)(body + h->sec[S_BYTES].off);
    b->special = body + h->sec[S_SPECIAL].off;
    b->vslot = (tks__bpe_vslot *)(body + h->sec[S_VSLOT].off);
    b->mslot = h->mode == TKS__BPE_MERGES ? (tks__bpe_merge *)(body + h->sec[S_MSLOT].off) : NULL;
    b->seed = (pslot *)(body + h->sec[S_SEED].off); /* (copied onto 2 MiB pages: no faster) */
    b->seed_bits = h->seed_bits;
    b->mq = h->mqmask ? (uint64_t *)(body + h->sec[S_MQ].off) : NULL;
    b->mqmask = h->mqmask;
    b->mq_id = h->mq_id, b->mq_sub = h->mq_sub, b->mq_p = h->mq_p;
    set_in(&b->added_raw, &h->raw, body + h->sec[S_RAW].off);
    set_in(&b->added_norm, &h->norm, body + h->sec[S_NORM].off);
    b->added_text = (char *)(body + h->sec[S_TEXT].off);
    b->cache_map = m;
    b->cache_len = size;
    /* the holes are the handle's own (tks_bpe_free frees them either way) */
    if (h->sec[S_HOLE].len && !(b->hole = malloc(h->sec[S_HOLE].len))) return tks__bpe_nomem(b, "holes");
    if (h->sec[S_HOLE].len) memcpy(b->hole, body + h->sec[S_HOLE].off, h->sec[S_HOLE].len);
    const char *pats = (const char *)(body + h->sec[S_PAT].off);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < h->n_split; i++) {
        const cache_split *cs = &h->split[i];
        rc = tks__bpe_compile_opts(b, pats + cs->pat_off, cs->pat_len, cs->opts, "cached pre-tokenizer");
        if (!rc) b->split[i].how = (tks__bpe_behavior)cs->how, b->split[i].invert = (int)cs->invert;
    }
    if (!rc) rc = tks__bpe_finish_cached(b);
    return rc;
}

int tks_bpe_tables_xxh3(const tks_bpe *b, uint8_t out[16]) {
    cache_header *h = calloc(1, sizeof *h);
    char *pats = NULL;
    tks_piece pc[1 + 2 * N_SEC];
    size_t np = 0;
    int ok = h && !cache_pieces(b, h, &pats, pc, &np) && !digest(h, tables_head(), pc, np, NULL, out);
    free(pats);
    free(h);
    return ok;
}

const char *tks_bpe_cache_note(const tks_bpe *b) { return b->cache_note; }
