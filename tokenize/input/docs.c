/*
 * docs.c - documents out of the entries' bytes: lines, blank-line
 * paragraphs, whole entries and JSONL records (a Parquet file's rows:
 * pq_input.c), and positions in the inputs (tks_input_tell, tks_input_seek).
 * The policies every document goes through are policy.c's.
 *
 * Lines are found with memchr in the blocks stream.c hands out; a line that
 * lies inside one block is handed out in place, one that spans blocks is
 * assembled in `line`. Documents are only buffered whole for --doc-split
 * file and blank-line paragraphs, and never beyond max_doc_bytes: the rest
 * of a longer document is read and dropped without being kept.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/input/input.h"
#include "common/tks_bits.h"

static int is_blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!tks__blank_byte((unsigned char)p[i])) return 0;
    return 1;
}

/* Case-insensitive: does the first n bytes of s end with suf? */

typedef struct line {
    const char *p;   /* the line without its "\n" (and the "\r" before it) */
    size_t len;
    uint64_t no;     /* 1-based line number in the entry */
    uint64_t off;    /* offset of its first byte in the decompressed entry */
    int cr;          /* a "\r" before the "\n" was stripped */
    int too_long;    /* longer than the cap: p/len unset, the bytes were dropped */
    int blank;       /* when too_long: the dropped bytes were all whitespace */
} line;

/*
 * Reads the next line of the entry, keeping at most `cap` bytes (the line
 * without "\n"). Longer lines are consumed to their end without being kept,
 * unless `stop_early`, where it returns as soon as the line is known to be
 * too long. Returns 1, 0 at the end of the entry, or an error.
 */
static int read_line(tks_input *in, size_t cap, int stop_early, line *ln) {
    buf *lb = &in->line;
    lb->len = 0;
    int any = 0, too_long = 0, blank = 1, nl_seen = 0;
    const char *zp = NULL; /* in-place line */
    size_t zlen = 0;
    uint64_t start = in->entry_off;
    for (;;) {
        if (in->cur == in->end) {
            int r = tks__entry_fill(in);
            if (r < 0) return r;
            if (r == 0) {
                if (!any) return 0;
                break; /* last line without "\n" */
            }
        }
        if (!any) start = in->entry_off - (uint64_t)(in->end - in->cur);
        any = 1;
        size_t avail = (size_t)(in->end - in->cur);
        const char *nl = memchr(in->cur, '\n', avail);
        size_t take = nl ? (size_t)(nl - in->cur) : avail;
        if (!too_long) {
            if (lb->len == 0 && nl && take <= cap) {
                zp = in->cur;
                zlen = take;
                in->cur = nl + 1;
                nl_seen = 1;
                break;
            }
            if (take > cap - lb->len) {
                too_long = 1;
                blank = is_blank(lb->p, lb->len) && is_blank(in->cur, take);
                lb->len = 0;
                if (stop_early && !blank) { /* a blank line still ends a paragraph */
                    in->cur += take;
                    break;
                }
            } else {
                int rc = tks__buf_append(lb, in->cur, take);
                if (rc) return rc;
            }
        } else if (blank) {
            blank = is_blank(in->cur, take);
        }
        in->cur += take;
        if (nl) {
            in->cur++;
            nl_seen = 1;
            break;
        }
    }
    memset(ln, 0, sizeof *ln);
    ln->no = ++in->line_no;
    ln->off = start;
    if (too_long) {
        ln->too_long = 1;
        ln->blank = blank;
        return 1;
    }
    ln->p = zp ? zp : lb->p;
    ln->len = zp ? zlen : lb->len;
    if (!ln->p) ln->p = ""; /* empty last line, never buffered */
    if (nl_seen && ln->len && ln->p[ln->len - 1] == '\r') {
        ln->len--;
        ln->cr = 1;
    }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* documents                                                                  */

static int bad_record(tks_input *in, uint64_t line_no, const char *why) {
    if (in->opts.bad_record == TKS_POLICY_FAIL) {
        int rc = tks_fail(TKS_ERR_JSONL, in->source.p, TKS_NONE, TKS_NONE,
                          "%s:%llu: %s; fix the record or use --on-bad-record skip", in->source.p,
                          (unsigned long long)line_no, why);
        tks_error_set_doc(in->st.docs, line_no);
        return rc;
    }
    in->st.bad_records_skipped++;
    return 0;
}

static int next_line_doc(tks_input *in, tks_doc *doc) {
    int stop_early = in->opts.long_doc == TKS_POLICY_FAIL;
    for (;;) {
        line ln;
        int r = read_line(in, in->line_cap, stop_early, &ln);
        if (r <= 0) return r;
        if (ln.too_long || ln.len > in->max_doc) {
            if ((r = tks__too_long(in, ln.no)) < 0) return r;
            continue;
        }
        if (ln.len == 0) {
            in->st.empty_skipped++;
            continue;
        }
        if ((r = tks__emit(in, ln.p, ln.len, ln.no, ln.off, doc)) != 0) return r;
    }
}

/* Paragraphs: runs of lines that are not whitespace-only. Inner line breaks
 * are kept as they are in the input ("\n" or "\r\n"), the last one dropped. */
static int next_paragraph(tks_input *in, tks_doc *doc) {
    int stop_early = in->opts.long_doc == TKS_POLICY_FAIL;
    buf *pa = &in->para;
    pa->len = 0;
    int have = 0, over = 0, prev_cr = 0;
    uint64_t first = 0, first_off = 0;
    for (;;) {
        line ln;
        int r = read_line(in, in->line_cap, stop_early, &ln);
        if (r < 0) return r;
        int blank = r == 0 || (ln.too_long ? ln.blank : is_blank(ln.p, ln.len));
        if (blank) {
            if (have) {
                int e = over ? tks__too_long(in, first) : tks__emit(in, pa->p, pa->len, first, first_off, doc);
                if (e != 0) return e; /* yielded, or an error */
                have = over = 0;
                pa->len = 0;
            }
            if (r == 0) return 0;
            continue;
        }
        if (!have) {
            have = 1;
            first = ln.no;
            first_off = ln.off;
        }
        if (over) continue;
        size_t sep = pa->len ? 1 + (size_t)prev_cr : 0;
        if (ln.too_long || ln.len + sep > in->max_doc - pa->len) {
            over = 1;
            if (stop_early) return tks__too_long(in, first);
            continue;
        }
        if (sep) {
            if (prev_cr && (r = tks__buf_append(pa, "\r", 1))) return r;
            if ((r = tks__buf_append(pa, "\n", 1))) return r;
        }
        if ((r = tks__buf_append(pa, ln.p, ln.len))) return r;
        prev_cr = ln.cr;
    }
}

/* The whole entry is one document. */
static int next_file_doc(tks_input *in, tks_doc *doc) {
    buf *pa = &in->para;
    pa->len = 0;
    int binary = 0, over = 0;
    for (;;) {
        int r = tks__entry_fill(in);
        if (r < 0) return r;
        if (r == 0) break;
        const char *p = in->cur;
        size_t n = (size_t)(in->end - in->cur);
        in->cur = in->end;
        if (binary || over) continue;
        if (memchr(p, 0, n)) {
            binary = 1;
            continue;
        }
        if (n > in->max_doc - pa->len) {
            over = 1;
            if (in->opts.long_doc == TKS_POLICY_FAIL) return tks__too_long(in, 1);
            continue;
        }
        if ((r = tks__buf_append(pa, p, n))) return r;
    }
    if (binary) {
        in->st.binary_skipped++;
        return 0;
    }
    if (over) return tks__too_long(in, 1);
    if (pa->len == 0) {
        in->st.empty_skipped++;
        return 0;
    }
    return tks__emit(in, pa->p, pa->len, 1, 0, doc);
}

int tks__jsonl_fast(const char *line, size_t len, const char *key, const char **text, size_t *n);

tks_jsonl_status tks_jsonl_decode(const char *line, size_t len, const char *key, uint64_t max_doc,
                                  json_t **root_out, const char **text, size_t *n, char *why, size_t cap) {
    *root_out = NULL;
    if (cap) why[0] = 0;
    /* the fast path decides every record jansson would accept alike; the
     * rest (and every bad record, for its message) go to jansson below */
    if (tks__jsonl_fast(line, len, key, text, n) && !memchr(*text, 0, *n)) {
        if (*n > max_doc) return TKS_JSONL_LONG;
        return *n ? TKS_JSONL_OK : TKS_JSONL_EMPTY;
    }
    return tks__jsonl_decode_jansson(line, len, key, max_doc, root_out, text, n, why, cap);
}

tks_jsonl_status tks__jsonl_decode_jansson(const char *line, size_t len, const char *key, uint64_t max_doc,
                                           json_t **root_out, const char **text, size_t *n, char *why,
                                           size_t cap) {
    json_error_t err;
    json_t *root = json_loadb(line, len, JSON_ALLOW_NUL, &err), *v = NULL;
    *root_out = NULL;
    if (cap) why[0] = 0;
    if (!root)
        snprintf(why, cap, "not valid JSON: %s (column %d)", err.text, err.column);
    else if (!json_is_object(root))
        snprintf(why, cap, "not a JSON object");
    else if (!(v = json_object_get(root, key)))
        snprintf(why, cap, "no key \"%.200s\"", key);
    else if (!json_is_string(v))
        snprintf(why, cap, "the value of \"%.200s\" is not a string", key);
    else if (memchr(json_string_value(v), 0, json_string_length(v)))
        snprintf(why, cap, "the value of \"%.200s\" contains a NUL character (\\u0000)", key);
    else if (json_string_length(v) > max_doc) {
        json_decref(root);
        return TKS_JSONL_LONG;
    } else if (json_string_length(v) == 0) {
        json_decref(root);
        return TKS_JSONL_EMPTY;
    } else {
        *root_out = root;
        *text = json_string_value(v);
        *n = json_string_length(v);
        return TKS_JSONL_OK;
    }
    json_decref(root);
    return TKS_JSONL_BAD;
}

static int next_jsonl_doc(tks_input *in, tks_doc *doc) {
    int stop_early = in->opts.long_doc == TKS_POLICY_FAIL;
    for (;;) {
        line ln;
        int r = read_line(in, in->jsonl_cap, stop_early, &ln);
        if (r <= 0) return r;
        if (ln.too_long) {
            if (ln.blank) continue;
            if ((r = tks__too_long(in, ln.no)) < 0) return r;
            continue;
        }
        const char *p = ln.p;
        size_t len = ln.len;
        uint64_t off = ln.off;
        if (ln.off == 0 && len >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) { /* byte order mark */
            p += 3;
            len -= 3;
            off += 3;
        }
        if (is_blank(p, len)) continue;

        if (in->opts.defer_json) /* decoded by the caller (tks_jsonl_decode) */
            return tks__doc_fill(in, p, len, ln.no, 1, off, len, doc);
        char why[400];
        json_t *root;
        const char *text;
        size_t n;
        tks_jsonl_status js = tks_jsonl_decode(p, len, in->jsonl_key, in->max_doc, &root, &text, &n, why, sizeof why);
        if (js == TKS_JSONL_BAD) {
            if ((r = bad_record(in, ln.no, why)) < 0) return r;
            continue;
        }
        if (js == TKS_JSONL_LONG) {
            if ((r = tks__too_long(in, ln.no)) < 0) return r;
            continue;
        }
        if (js == TKS_JSONL_EMPTY) {
            in->st.empty_skipped++;
            continue;
        }
        in->json = root; /* text points into it (or, root NULL, into this thread's buffer of jsonl_fast.cc) until the next call */
        if ((r = tks__emit(in, text, n, ln.no, TKS_NONE, doc)) != 0) {
            doc->offset = off; /* the record's place, not its string's */
            doc->raw_len = len;
            return r;
        }
        json_decref(in->json);
        in->json = NULL;
    }
}

/* ------------------------------------------------------------------------- */
/* positions (work units)                                                     */

int tks_input_tell(const tks_input *in, tks_input_pos *pos) {
    memset(pos, 0, sizeof *pos);
    pos->ordinal = in->st.docs;
    if (!in->a) { /* between files */
        pos->file = in->next_file;
        return 0;
    }
    pos->file = in->next_file - 1;
    if (!in->in_entry || in->entry_eof) { /* the entry is done: the next one */
        if (!in->is_archive) {
            pos->file++;
        } else {
            pos->entry = in->entry_no;
        }
        return 0;
    }
    pos->entry = in->entry_no - 1;
    pos->offset = in->entry_off - (uint64_t)(in->end - in->cur);
    pos->line = in->line_no;
    /* a file read as it is on disk: its decompressed offsets are file offsets */
    pos->plain = !in->is_archive && in->fs_on && !in->fs.gzip && in->depth == 0 &&
                 archive_filter_count(in->a) == 1 && archive_filter_code(in->a, 0) == ARCHIVE_FILTER_NONE &&
                 archive_format(in->a) == ARCHIVE_FORMAT_RAW;
    return 0;
}

int tks_input_seek(tks_input *in, const tks_input_pos *pos) {
    if (in->a || in->next_file || in->st.docs)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "tks_input_seek: the input was already read");
    if (pos->file > in->n_files || (pos->file == in->n_files && (pos->entry || pos->offset)))
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "tks_input_seek: file %llu of %zu", (unsigned long long)pos->file, in->n_files);
    in->no_hash = 1;
    in->next_file = (size_t)pos->file;
    in->st.docs = pos->ordinal;
    if (pos->file == in->n_files || (pos->entry == 0 && pos->offset == 0)) return 0;
    in->plain_seek = pos->plain && pos->entry == 0 && pos->offset > 0;
    in->seek_off = pos->offset;
    int plain = in->plain_seek, r = tks__open_file(in);
    if (r < 0) return in->failed = r;
    for (uint64_t e = 0; e <= pos->entry; e++) { /* earlier members are read and dropped */
        if ((r = tks__next_entry(in)) < 0) return in->failed = r;
        if (r == 0) { /* the position is past the last member: the next file */
            tks__close_file(in);
            return 0;
        }
    }
    in->line_no = pos->line;
    if (plain) { /* opened at the offset */
        in->entry_off = pos->offset;
        in->probed = 1;
        return 0;
    }
    uint64_t left = pos->offset;
    while (left) {
        if (in->cur == in->end) {
            if ((r = tks__entry_fill(in)) < 0) return in->failed = r;
            if (r == 0) break;
        }
        size_t take = (size_t)(in->end - in->cur);
        if (take > left) take = (size_t)left;
        in->cur += take;
        left -= take;
    }
    return 0;
}

int tks_input_next(tks_input *in, tks_doc *doc) {
    if (!in || !doc) return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "tks_input_next: NULL argument");
    if (in->failed) return in->failed;
    if (in->json) {
        json_decref(in->json);
        in->json = NULL;
    }
    int r;
    for (;;) {
        if (in->pqr) { /* a Parquet file: its rows */
            if ((r = tks__pq_next_doc(in, doc)) == 1) return 1;
            if (r < 0) break;
            continue;
        }
        if (!in->a) {
            uint64_t g0 = 0, g1 = UINT64_MAX; /* a Parquet file's row groups */
            if (in->ranges) { /* a work unit's reader: its next range */
                if (in->next_range == in->n_ranges) return 0;
                const tks__range *g = &in->ranges[in->next_range++];
                in->next_file = (size_t)g->file;
                int plain = g->whole == 0;
                in->plain_seek = plain;
                in->seek_off = in->from = plain ? g->start : 0;
                in->limit = plain ? g->end : 0;
                if (g->whole == TKS__RANGE_PARQUET) g0 = g->start, g1 = g->end;
            } else if (in->next_file == in->n_files) {
                return 0;
            }
            if (in->meta[in->next_file].parquet) {
                if ((r = tks__pq_open_file(in, g0, g1)) < 0) break;
                continue;
            }
            if ((r = tks__open_file(in)) < 0) break;
        }
        if (!in->in_entry) {
            if ((r = tks__next_entry(in)) < 0) break;
            if (r == 0) {
                /* a plain file with no entry at all is empty: under
                 * --doc-split file, one empty document (counted) */
                if (!in->is_archive && in->entry_no == 0 && in->opts.split == TKS_SPLIT_FILE &&
                    in->opts.format != TKS_FMT_JSONL &&
                    !(in->opts.format == TKS_FMT_AUTO && tks__has_ext(in->path, ".jsonl")))
                    in->st.empty_skipped++;
                tks__close_file(in);
                continue;
            }
        }
        if (in->entry_eof) {
            in->in_entry = 0;
            continue;
        }
        if (in->entry_jsonl) r = next_jsonl_doc(in, doc);
        else if (in->opts.split == TKS_SPLIT_LINE) r = next_line_doc(in, doc);
        else if (in->opts.split == TKS_SPLIT_BLANK) r = next_paragraph(in, doc);
        else r = next_file_doc(in, doc);
        if (r == 1) return 1;
        if (r < 0) break;
        in->in_entry = 0;
    }
    in->failed = r;
    return r;
}

