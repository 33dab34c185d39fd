/* wtab.c - one thread's table of words for byte-level BPE training: the
 * distinct pieces it has cut with their 64-bit counts, in a bounded amount
 * of memory, spilled as a sorted run (wruns.c) when it is full
 * (pipeline.h, "Counting words"). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "tokenize/pipeline/pipeline.h"

/* A slot: the hash's top 24 bits << 40 | the entry's offset in the arena /
 * 8 (entries start at byte 8, so a used slot is never 0). An entry: u64
 * count, u32 length, the bytes, padded to 8. */
#define OFF_MASK ((1ull << 40) - 1)
#define ENTRY_HEAD 12

static inline size_t entry_size(size_t n) { return (ENTRY_HEAD + n + 7) & ~(size_t)7; }

/* The first min(n, 8) bytes of s (n >= 1), zero above, with at most two
 * loads: bytes 0..3 and n-4..n-1 overlap with equal values. */
static inline uint64_t head8(const char *s, size_t n) {
    uint64_t v;
    uint32_t a, b;
    uint16_t c, d;
    if (n >= 8) return memcpy(&v, s, 8), v;
    if (n >= 4) return memcpy(&a, s, 4), memcpy(&b, s + n - 4, 4), a | (uint64_t)b << (8 * (n - 4));
    if (n >= 2) return memcpy(&c, s, 2), memcpy(&d, s + n - 2, 2), c | (uint64_t)d << (8 * (n - 2));
    return (uint8_t)s[0];
}

/* A word's hash: words of up to 16 bytes (nearly all) from two loads and
 * two multiplies, longer ones XXH3-64. Used for the table only: nothing on
 * disk depends on it. */
uint64_t tks__wtab_hash(const char *w, size_t n) {
    if (n > 16) return XXH3_64bits(w, n);
    uint64_t a = head8(w, n), b = n > 8 ? head8(w + 8, n - 8) : 0;
    uint64_t h = (a ^ 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull ^ (b + n) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

/* 1 when the entry at e holds w[0..n). */
static inline int same_word(const uint8_t *e, const char *w, size_t n) {
    uint32_t len;
    memcpy(&len, e + 8, 4);
    if (len != n) return 0;
    if (n <= 16) {
        const char *x = (const char *)e + ENTRY_HEAD;
        if (head8(x, n) != head8(w, n)) return 0;
        return n <= 8 || head8(x + 8, n - 8) == head8(w + 8, n - 8);
    }
    return !memcmp(e + ENTRY_HEAD, w, n);
}

void tks__wtab_init(tks__wtab *t, size_t budget) {
    memset(t, 0, sizeof *t);
    t->budget = budget < (256u << 10) ? (256u << 10) : budget;
}

void tks__wtab_free(tks__wtab *t) {
    free(t->slot);
    free(t->arena);
    memset(t, 0, sizeof *t);
}

static size_t slot_bytes(const tks__wtab *t) { return t->slot ? (t->mask + 1) * sizeof *t->slot : 0; }

static int grow_slots(tks__wtab *t) {
    size_t n = t->slot ? 2 * (t->mask + 1) : 4096;
    if (t->slot && n * sizeof *t->slot + t->acap > t->budget) return 1;
    uint64_t *s = calloc(n, sizeof *s);
    if (!s) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (word table)");
    for (size_t i = 0; t->slot && i <= t->mask; i++) {
        uint64_t v = t->slot[i];
        if (!v) continue;
        const uint8_t *e = t->arena + (v & OFF_MASK) * 8;
        uint32_t len;
        memcpy(&len, e + 8, 4);
        size_t j = tks__wtab_hash((const char *)e + ENTRY_HEAD, len) & (n - 1);
        while (s[j]) j = (j + 1) & (n - 1);
        s[j] = v;
    }
    free(t->slot);
    t->slot = s;
    t->mask = n - 1;
    return 0;
}

/* Room for `need` more arena bytes: 0, 1 (the budget is reached) or an error. */
static int grow_arena(tks__wtab *t, size_t need) {
    if (t->alen + need <= t->acap) return 0;
    size_t cap = t->acap ? 2 * t->acap : (64u << 10);
    while (cap < t->alen + need) cap *= 2;
    size_t room = t->budget > slot_bytes(t) ? t->budget - slot_bytes(t) : 0;
    if (cap > room) cap = room;
    if (!t->used && cap < t->alen + need + 8) cap = t->alen + need + 8; /* one word over the budget: alone */
    if (cap < t->alen + need || cap <= t->acap) return 1;
    uint8_t *a = realloc(t->arena, cap);
    if (!a) return tks_fail(TKS_ERR_NOMEM, NULL, TKS_NONE, TKS_NONE, "out of memory (word table)");
    t->arena = a;
    t->acap = cap;
    if (!t->alen) t->alen = 8;
    return 0;
}

/* Adds c to word w[0..n) (hash h) in the table: 0, 1 (full) or an error. */
static int table_add(tks__wtab *t, const char *w, size_t n, uint64_t h, uint64_t c) {
    if (!t->slot) {
        int rc = grow_slots(t);
        if (rc) return rc;
    }
    uint64_t tag = h >> 40;
    size_t i = h & t->mask;
    for (;; i = (i + 1) & t->mask) {
        uint64_t v = t->slot[i];
        if (!v) break;
        if ((v >> 40) != tag) continue;
        uint8_t *e = t->arena + (v & OFF_MASK) * 8;
        if (same_word(e, w, n)) {
            uint64_t had;
            memcpy(&had, e, 8);
            had += c;
            memcpy(e, &had, 8);
            return 0;
        }
    }
    /* a new word: room for it, the slots at most half full */
    if ((t->used + 1) * 2 > t->mask + 1) {
        int rc = grow_slots(t);
        if (rc) return rc;
        return table_add(t, w, n, h, c);
    }
    int rc = grow_arena(t, entry_size(n));
    if (rc) return rc;
    uint8_t *e = t->arena + t->alen;
    uint32_t len = (uint32_t)n;
    memcpy(e, &c, 8);
    memcpy(e + 8, &len, 4);
    memcpy(e + ENTRY_HEAD, w, n);
    t->slot[i] = tag << 40 | (t->alen / 8);
    t->alen += entry_size(n);
    t->used++;
    return 0;
}

int tks__wtab_add(tks__wtab *t, const char *w, size_t n, uint64_t h) { return table_add(t, w, n, h, 1); }

/* qsort_r's order of (first 8 bytes big-endian, entry offset) pairs: by
 * the words' bytes, a prefix first. */
static int by_word(const void *pa, const void *pb, void *arena) {
    const uint64_t *a = pa, *b = pb;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    const uint8_t *ea = (const uint8_t *)arena + a[1], *eb = (const uint8_t *)arena + b[1];
    uint32_t la, lb;
    memcpy(&la, ea + 8, 4);
    memcpy(&lb, eb + 8, 4);
    int c = memcmp(ea + ENTRY_HEAD, eb + ENTRY_HEAD, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

int tks__wtab_spill(tks__wtab *t, const char *path, size_t buf_bytes) {
    /* the sort's (key, offset) pairs in the slots' own memory: at most half
     * full, it holds two words a used slot */
    size_t n = 0;
    for (size_t i = 0; t->slot && i <= t->mask; i++)
        if (t->slot[i]) t->slot[n++] = (t->slot[i] & OFF_MASK) * 8;
    for (size_t k = n; k-- > 0;) {
        uint64_t off = t->slot[k];
        const uint8_t *e = t->arena + off;
        uint32_t len;
        memcpy(&len, e + 8, 4);
        uint64_t key = 0;
        for (uint32_t j = 0; j < 8; j++) key = key << 8 | (j < len ? e[ENTRY_HEAD + j] : 0);
        t->slot[2 * k] = key;
        t->slot[2 * k + 1] = off;
    }
    if (n > 1) qsort_r(t->slot, n, 2 * sizeof *t->slot, by_word, t->arena);
    tks__run_writer w;
    int rc = tks__run_create(&w, path, buf_bytes);
    for (size_t k = 0; !rc && k < n; k++) {
        const uint8_t *e = t->arena + t->slot[2 * k + 1];
        uint64_t c;
        uint32_t len;
        memcpy(&c, e, 8);
        memcpy(&len, e + 8, 4);
        rc = tks__run_put(&w, (const char *)e + ENTRY_HEAD, len, c);
    }
    if (!rc) rc = tks__run_finish(&w);
    tks__run_writer_free(&w);
    if (t->slot) memset(t->slot, 0, slot_bytes(t));
    t->used = 0;
    t->alen = t->arena ? 8 : 0;
    t->spills++;
    return rc;
}
