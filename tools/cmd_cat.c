/* cmd_cat.c - cat: the documents of a dataset or shard, decoded or as ids
 * (tokshard cat). */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "interop/interop.h"
#include "tokenize/tokenize.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"
#include "tools/dist.h"
#include "tools/peer.h"
#include "tools/cmds.h"

static int set_text(const cli_flag *f, const char *name, const char *v) {
    (void)name, (void)v;
    *(int *)f->ptr = 0;
    return 0;
}

/* One document on one line of a terminal: newline as \n, backslash as \\,
 * every other control character visible as \xNN (C0 and DEL) or \u00NN
 * (C1, U+0080-U+009F): a document's ESC, OSC, BEL or CR never reaches the
 * terminal as such (--raw writes the bytes). */
static void put_escaped(const char *text, size_t tl) {
    for (size_t i = 0; i < tl; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c == '\t') putchar('\t');
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else if (c == 0xc2 && i + 1 < tl && (unsigned char)text[i + 1] >= 0x80 && (unsigned char)text[i + 1] <= 0x9f)
            printf("\\u%04x", (unsigned char)text[++i]);
        else putchar(c);
    }
}

int cli_cat(int argc, char **argv) {
    int mode_ids = 0, raw = 0;
    uint64_t only = TKS_NONE, limit = TKS_NONE;
    const cli_flag flags[] = {
        {.name = "--ids", .type = CLI_BOOL, .ptr = &mode_ids},
        {.name = "--text", .type = CLI_BOOL, .ptr = &mode_ids, .set = set_text},
        {.name = "--raw", .type = CLI_BOOL, .ptr = &raw},
        {.name = "--doc", .type = CLI_SIZE, .ptr = &only},
        {.name = "--limit", .type = CLI_SIZE, .ptr = &limit},
        {0},
    };
    const char *path;
    int rc = parse_view_args("cat", flags, argc, argv, &path);
    if (rc != CLI_PARSED) return rc;
    view v;
    rc = open_view(path, &v, !mode_ids);
    if (rc) return rc;
    if (!mode_ids && !v.tk) {
        close_view(&v);
        return cli_usage_error("cat: decoding text needs a dataset DIR (with its tokenizer); use --ids for a lone shard");
    }
    uint64_t g = 0, printed = 0;
    uint32_t *buf = NULL;
    size_t cap = 0;
    int found = only == TKS_NONE;
    for (size_t s = 0; s < view_n(&v) && printed < limit; s++) {
        const tks_shard *sh = view_shard(&v, s);
        const tks_shard_header *h = tks_shard_hdr(sh);
        const uint64_t *ix = tks_shard_doc_index(sh);
        if (only != TKS_NONE && only >= g + h->n_docs) {
            g += h->n_docs;
            continue;
        }
        for (uint64_t d = 0; d < h->n_docs && printed < limit; d++, g++) {
            if (only != TKS_NONE && g != only) continue;
            found = 1;
            uint64_t len = ix[d + 1] - ix[d];
            if (len > cap) {
                free(buf);
                cap = len;
                buf = malloc(cap * sizeof *buf);
            }
            if (tks_shard_read(sh, ix[d], len, 0, buf)) {
                free(buf);
                close_view(&v);
                return cli_lib_error();
            }
            if (mode_ids) {
                for (uint64_t i = 0; i < len; i++) printf(i ? " %u" : "%u", buf[i]);
                putchar('\n');
            } else {
                char *text;
                size_t tl;
                if (tks_tok_decode(v.tk, buf, len, &text, &tl)) {
                    free(buf);
                    close_view(&v);
                    return cli_lib_error();
                }
                if (raw) fwrite(text, 1, tl, stdout);
                else put_escaped(text, tl);
                putchar('\n');
                free(text);
            }
            printed++;
            if (only != TKS_NONE) break;
        }
        if (only != TKS_NONE && found) break;
    }
    free(buf);
    uint64_t total = 0; /* every shard's, whatever --limit let the loop see */
    for (size_t s = 0; s < view_n(&v); s++) total += tks_shard_hdr(view_shard(&v, s))->n_docs;
    close_view(&v);
    if (only != TKS_NONE && only >= total) {
        fprintf(stderr, "%s: error: --doc %llu: the dataset has %llu documents (0 to %llu)\n", cli_prog,
                (unsigned long long)only, (unsigned long long)total,
                (unsigned long long)(total ? total - 1 : 0));
        return EXIT_USAGE;
    }
    return fflush(stdout) == 0 ? 0 : EXIT_USAGE;
}
