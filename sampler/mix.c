/* mix.c - mixtures of datasets as the user gives them (--dataset
 * NAME=DIR:W, --mix FILE.json, --mix-at STEP:NAME=W,...), their checks and
 * their blend (docs/SAMPLING.md §9). Declarations and contracts: sampler.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tks_json.h"
#include "sampler/sampler.h"

typedef unsigned long long ull;

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE, "%s", msg);
}

/* A source name: 1..63 of [A-Za-z0-9_.-], not starting with '.' or '-'. */
static int good_name(const char *s, size_t n) {
    if (n == 0 || n >= TKS_MIX_NAME_MAX || s[0] == '.' || s[0] == '-') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

/* A weight as typed: the whole text a finite or infinite number (checked
 * later); 0 with *w set, -1 when the text is not a number. */
static int parse_weight(const char *s, double *w) {
    char *end;
    errno = 0;
    if (!*s) return -1;
    *w = strtod(s, &end);
    return *end || end == s ? -1 : 0;
}

static int add_source(tks_mix_spec *m, const char *name, size_t nlen, const char *dir, size_t dlen,
                      double w, const char *arg) {
    if (m->n_sources >= TKS_MIX_MAX_SOURCES)
        return bad("--dataset %s: more than %d sources; merge some datasets", arg, TKS_MIX_MAX_SOURCES);
    if (dlen == 0 || dlen >= sizeof m->sources[0].dir)
        return bad("--dataset %s: the directory is %s", arg, dlen ? "too long" : "empty");
    tks_mix_source *s = &m->sources[m->n_sources++];
    memcpy(s->name, name, nlen);
    s->name[nlen] = 0;
    memcpy(s->dir, dir, dlen);
    s->dir[dlen] = 0;
    s->weight = w;
    return 0;
}

int tks_mix_add_dataset(tks_mix_spec *m, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq || !good_name(arg, (size_t)(eq - arg))) { /* a plain dataset directory */
        if (m->n_sources > 0)
            return bad("--dataset %s: several datasets make a mixture, and each needs a name and a "
                       "weight: --dataset NAME=DIR:WEIGHT (names of letters, digits, '_', '-', '.')",
                       arg);
        const char *base = strrchr(arg, '/');
        char nm[TKS_MIX_NAME_MAX];
        snprintf(nm, sizeof nm, "%s", base && base[1] ? base + 1 : arg);
        int rc = add_source(m, nm, strlen(nm), arg, strlen(arg), 1.0, arg);
        m->named = 0;
        return rc;
    }
    if (m->n_sources > 0 && !m->named)
        return bad("--dataset %s: the other --dataset has no name; in a mixture give every source "
                   "as NAME=DIR:WEIGHT", arg);
    const char *dir = eq + 1, *colon = strrchr(dir, ':');
    double w = 1.0;
    size_t dlen = strlen(dir);
    if (colon && parse_weight(colon + 1, &w) == 0) dlen = (size_t)(colon - dir);
    else w = 1.0;
    m->named = 1;
    return add_source(m, arg, (size_t)(eq - arg), dir, dlen, w, arg);
}

int tks_mix_add_change(tks_mix_spec *m, const char *arg) {
    const char *colon = strchr(arg, ':');
    char *end;
    errno = 0;
    unsigned long long step = colon ? strtoull(arg, &end, 10) : 0;
    if (!colon || end != colon || errno || arg[0] < '0' || arg[0] > '9')
        return bad("--mix-at %s: expected STEP:NAME=WEIGHT[,NAME=WEIGHT...], e.g. 9000:web=0.5,books=0.5",
                   arg);
    if (m->n_changes >= TKS_MIX_MAX_CHANGES)
        return bad("--mix-at %s: more than %d schedule changes", arg, TKS_MIX_MAX_CHANGES);
    if (strlen(colon + 1) >= sizeof m->changes[0].text)
        return bad("--mix-at %s: longer than %zu bytes", arg, sizeof m->changes[0].text - 1);
    tks_mix_change *c = &m->changes[m->n_changes++];
    c->step = step;
    snprintf(c->text, sizeof c->text, "%s", colon + 1);
    return 0;
}

/* The index of source `name` (n bytes), or -1. */
static int find_source(const tks_mix_spec *m, const char *name, size_t n) {
    for (uint32_t k = 0; k < m->n_sources; k++)
        if (strlen(m->sources[k].name) == n && !memcmp(m->sources[k].name, name, n)) return (int)k;
    return -1;
}

/* The source names as "a, b, c" for messages. */
static void name_list(const tks_mix_spec *m, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (uint32_t k = 0; k < m->n_sources && n < cap; k++)
        n += (size_t)snprintf(out + n, cap - n, "%s%s", k ? ", " : "", m->sources[k].name);
}

/* Change c's weights into w[n_sources] (0 for a source not named). */
static int change_weights(const tks_mix_spec *m, const tks_mix_change *c, double *w) {
    char known[1024];
    for (uint32_t k = 0; k < m->n_sources; k++) w[k] = 0;
    const char *p = c->text;
    int any = 0;
    while (*p) {
        const char *comma = strchr(p, ','), *e = comma ? comma : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(e - p));
        char num[64];
        double x;
        size_t nl = eq ? (size_t)(e - eq - 1) : 0;
        if (!eq || nl == 0 || nl >= sizeof num)
            return bad("--mix-at %llu:%s: expected NAME=WEIGHT entries separated by ','",
                       (ull)c->step, c->text);
        memcpy(num, eq + 1, nl);
        num[nl] = 0;
        int k = find_source(m, p, (size_t)(eq - p));
        if (k < 0) {
            name_list(m, known, sizeof known);
            return bad("--mix-at %llu: weights for an unknown source '%.*s' (the sources are %s)",
                       (ull)c->step, (int)(eq - p), p, known);
        }
        if (parse_weight(num, &x) || !isfinite(x) || !(x > 0))
            return bad("--mix-at %llu: source %s: weight '%s' is not a finite number > 0 (leave a "
                       "source out of the list to stop drawing from it)",
                       (ull)c->step, m->sources[k].name, num);
        if (w[k] != 0)
            return bad("--mix-at %llu: source %s is given twice", (ull)c->step, m->sources[k].name);
        w[k] = x;
        any = 1;
        p = comma ? comma + 1 : e;
    }
    if (!any) return bad("--mix-at %llu: no weights (give NAME=WEIGHT for at least one source)", (ull)c->step);
    return 0;
}

int tks_mix_check(const tks_mix_spec *m, uint64_t steps) {
    if (m->n_sources == 0) return bad("--dataset is required (DIR, or NAME=DIR:WEIGHT per source)");
    if (!m->named && m->n_changes)
        return bad("--mix-at changes the weights of named sources: give the dataset as "
                   "--dataset NAME=DIR:WEIGHT");
    for (uint32_t k = 0; k < m->n_sources; k++) {
        const tks_mix_source *s = &m->sources[k];
        if (!isfinite(s->weight) || !(s->weight > 0))
            return bad("source %s (%s): weight %g is not a finite number > 0", s->name, s->dir, s->weight);
        for (uint32_t j = 0; j < k; j++)
            if (!strcmp(m->sources[j].name, s->name))
                return bad("the source name %s is used twice (%s and %s): give each source its own "
                           "name", s->name, m->sources[j].dir, s->dir);
    }
    double w[TKS_MIX_MAX_SOURCES];
    for (uint32_t i = 0; i < m->n_changes; i++) {
        const tks_mix_change *c = &m->changes[i];
        if (c->step < 2)
            return bad("--mix-at %llu: a change takes effect from step 2 on (step 1's weights are "
                       "the sources' own)", (ull)c->step);
        if (steps && c->step > steps)
            return bad("--mix-at %llu:%s: step %llu is beyond --steps %llu, so the change would "
                       "never happen; move it or raise --steps", (ull)c->step, c->text,
                       (ull)c->step, (ull)steps);
        for (uint32_t j = 0; j < i; j++)
            if (m->changes[j].step == c->step)
                return bad("--mix-at %llu is given twice", (ull)c->step);
        int rc = change_weights(m, c, w);
        if (rc) return rc;
    }
    return 0;
}

int tks_mix_blend(const tks_mix_spec *m, uint64_t global_batch, tks_blend *out) {
    int rc = tks_mix_check(m, 0);
    if (rc) return rc;
    if (global_batch == 0) return bad("a blend needs a global batch >= 1");
    /* changes in step order */
    uint32_t order[TKS_MIX_MAX_CHANGES], n = m->n_changes, K = m->n_sources;
    for (uint32_t i = 0; i < n; i++) order[i] = i;
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && m->changes[order[j]].step < m->changes[order[j - 1]].step; j--) {
            uint32_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double w[TKS_BLEND_MAX_PHASES * TKS_MIX_MAX_SOURCES];
    uint64_t start[TKS_BLEND_MAX_PHASES] = {0};
    const char *names[TKS_MIX_MAX_SOURCES];
    for (uint32_t k = 0; k < K; k++) w[k] = m->sources[k].weight, names[k] = m->sources[k].name;
    for (uint32_t i = 0; i < n; i++) {
        const tks_mix_change *c = &m->changes[order[i]];
        if (c->step - 1 > UINT64_MAX / global_batch)
            return bad("--mix-at %llu: the sample index overflows 64 bits", (ull)c->step);
        start[i + 1] = (c->step - 1) * global_batch;
        if ((rc = change_weights(m, c, w + (size_t)(i + 1) * K))) return rc;
    }
    return tks_blend_init(out, K, n + 1, start, w, names);
}

/* ---- the JSON forms: --mix FILE.json and a checkpoint's record ------------- */

/* sources[] and schedule[] of a JSON object into m; `where` names the origin
 * in messages; base: the directory relative paths are taken from (NULL:
 * as written). */
static int mix_from_object(json_t *o, tks_mix_spec *m, const char *where, const char *base, int err) {
    json_t *src = json_object_get(o, "sources"), *sch = json_object_get(o, "schedule");
    memset(m, 0, sizeof *m);
    m->named = 1;
    if (!json_is_array(src) || json_array_size(src) == 0 || (sch && !json_is_array(sch)))
        return tks_fail(err, where, TKS_NONE, TKS_NONE,
                        "%s: expected {\"sources\": [{\"name\", \"path\", \"weight\"}, ...], "
                        "\"schedule\": [{\"step\", \"weights\": {NAME: W}}]}", where);
    size_t i;
    json_t *e;
    json_array_foreach(src, i, e) {
        const char *nm = json_string_value(json_object_get(e, "name"));
        const char *p = json_string_value(json_object_get(e, "path"));
        json_t *w = json_object_get(e, "weight");
        if (!nm || !p || !json_is_number(w) || !good_name(nm, strlen(nm)))
            return tks_fail(err, where, TKS_NONE, TKS_NONE,
                            "%s: sources[%zu] needs a \"name\" (letters, digits, '_', '-', '.'), a "
                            "\"path\" and a number \"weight\"", where, i);
        char dir[4096];
        if (base && p[0] != '/') snprintf(dir, sizeof dir, "%s/%s", base, p);
        else snprintf(dir, sizeof dir, "%s", p);
        if (add_source(m, nm, strlen(nm), dir, strlen(dir), json_number_value(w), nm))
            return tks_fail(err, where, TKS_NONE, TKS_NONE, "%s: sources[%zu]: %s", where, i,
                            tks_last_error()->message);
    }
    json_array_foreach(sch, i, e) {
        json_t *st = json_object_get(e, "step"), *ws = json_object_get(e, "weights");
        if (!json_is_integer(st) || json_integer_value(st) < 0 || !json_is_object(ws) ||
            m->n_changes >= TKS_MIX_MAX_CHANGES)
            return tks_fail(err, where, TKS_NONE, TKS_NONE,
                            "%s: schedule[%zu] needs a \"step\" and \"weights\": {NAME: W} (at most "
                            "%d changes)", where, i, TKS_MIX_MAX_CHANGES);
        tks_mix_change *c = &m->changes[m->n_changes++];
        c->step = (uint64_t)json_integer_value(st);
        size_t n = 0;
        const char *k;
        json_t *v;
        json_object_foreach(ws, k, v) {
            if (!json_is_number(v))
                return tks_fail(err, where, TKS_NONE, TKS_NONE, "%s: schedule[%zu]: weight of %s "
                                "is not a number", where, i, k);
            n += (size_t)snprintf(c->text + n, n < sizeof c->text ? sizeof c->text - n : 0, "%s%s=%.17g",
                                  n ? "," : "", k, json_number_value(v));
            if (n >= sizeof c->text)
                return tks_fail(err, where, TKS_NONE, TKS_NONE, "%s: schedule[%zu] is too long", where, i);
        }
    }
    return 0;
}

/* Every key of object o is one of `allowed` (NULL-terminated), else an error
 * naming the key, where it is (what) and the keys allowed: a misspelt
 * "Schedule" must not silently drop the schedule. */
static int only_keys(const json_t *o, const char *const *allowed, const char *path, const char *what) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        int known = 0;
        for (size_t i = 0; allowed[i] && !known; i++) known = !strcmp(k, allowed[i]);
        if (known) continue;
        char list[160] = "";
        for (size_t i = 0, n = 0; allowed[i]; i++)
            n += (size_t)snprintf(list + n, n < sizeof list ? sizeof list - n : 0, "%s\"%s\"", i ? ", " : "",
                                  allowed[i]);
        return tks_fail(TKS_ERR_ARG, path, TKS_NONE, TKS_NONE, "--mix %s: unknown key \"%s\" in %s (allowed: %s)",
                        path, k, what, list);
    }
    return 0;
}

/* The --mix file's keys: its object, each source, each schedule entry. */
static int mix_file_keys(const json_t *o, const char *path) {
    static const char *const top[] = {"sources", "schedule", NULL}, *const src[] = {"name", "path", "weight", NULL},
                             *const sch[] = {"step", "weights", NULL};
    if (!json_is_object(o)) return 0; /* mix_from_object says what is expected */
    int rc = only_keys(o, top, path, "the file's object");
    size_t i;
    json_t *e;
    char what[64];
    json_array_foreach(json_object_get(o, "sources"), i, e) {
        snprintf(what, sizeof what, "sources[%zu]", i);
        if (!rc && json_is_object(e)) rc = only_keys(e, src, path, what);
    }
    json_array_foreach(json_object_get(o, "schedule"), i, e) {
        snprintf(what, sizeof what, "schedule[%zu]", i);
        if (!rc && json_is_object(e)) rc = only_keys(e, sch, path, what);
    }
    return rc;
}

int tks_mix_load(tks_mix_spec *m, const char *path) {
    json_error_t e;
    json_t *o = tks_json_load_regular(path, JSON_REJECT_DUPLICATES, &e);
    if (!o)
        return tks_fail(TKS_ERR_IO, path, TKS_NONE, TKS_NONE, "--mix %s: cannot read it as JSON: %s", path,
                        e.text);
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    int rc = mix_file_keys(o, path);
    if (!rc) rc = mix_from_object(o, m, path, dirname(copy), TKS_ERR_ARG);
    json_decref(o);
    return rc;
}

int tks_mix_from_json(const char *json, tks_mix_spec *m, tks_blend_state *cursor,
                      uint64_t *manifest_xxh3) {
    json_t *o = json_loads(json, 0, NULL);
    int rc = mix_from_object(o, m, "the checkpoint's mixture record", NULL, TKS_ERR_MANIFEST);
    for (uint32_t k = 0; !rc && manifest_xxh3 && k < m->n_sources; k++) {
        const char *mx = json_string_value(
            json_object_get(json_array_get(json_object_get(o, "sources"), k), "manifest_xxh3"));
        if (!mx || strlen(mx) != 16)
            rc = tks_fail(TKS_ERR_MANIFEST, NULL, TKS_NONE, TKS_NONE,
                          "the checkpoint's mixture record lacks source %s's manifest_xxh3",
                          m->sources[k].name);
        else manifest_xxh3[k] = strtoull(mx, NULL, 16);
    }
    if (!rc && cursor) {
        json_t *c = json_object_get(o, "cursor"), *n = json_object_get(c, "sample");
        json_t *cnt = json_object_get(c, "count"), *pc = json_object_get(c, "phase_count");
        memset(cursor, 0, sizeof *cursor);
        if (!json_is_integer(n) || !json_is_array(cnt) || !json_is_array(pc) ||
            json_array_size(cnt) != m->n_sources || json_array_size(pc) != m->n_sources)
            rc = tks_fail(TKS_ERR_MANIFEST, NULL, TKS_NONE, TKS_NONE,
                          "the checkpoint's mixture record has no cursor for its %u sources",
                          m->n_sources);
        uint64_t sum = 0;
        for (uint32_t k = 0; !rc && k < m->n_sources; k++) {
            json_int_t a = json_integer_value(json_array_get(cnt, k)), b = json_integer_value(json_array_get(pc, k));
            if (a < 0 || b < 0 || b > a) rc = -1;
            cursor->count[k] = (uint64_t)a;
            cursor->phase_count[k] = (uint64_t)b;
            sum += (uint64_t)a;
        }
        if (!rc) cursor->sample = (uint64_t)json_integer_value(n);
        if (rc == -1 || (!rc && sum != cursor->sample))
            rc = tks_fail(TKS_ERR_MANIFEST, NULL, TKS_NONE, TKS_NONE,
                          "the checkpoint's mixture cursor is inconsistent (its per-source counts "
                          "do not add up to its %llu samples)", (ull)cursor->sample);
    }
    json_decref(o);
    return rc;
}

int tks_mix_record(const tks_mix_spec *m, const char *const *abs_dirs, const uint64_t *manifest_xxh3,
                   const tks_blend_state *cursor, char *out, size_t cap) {
    json_t *o = json_object(), *src = json_array(), *sch = json_array(), *cnt = json_array(),
           *pc = json_array();
    double w[TKS_MIX_MAX_SOURCES];
    int rc = 0;
    for (uint32_t k = 0; k < m->n_sources; k++) {
        char mx[17];
        snprintf(mx, sizeof mx, "%016llx", (ull)manifest_xxh3[k]);
        json_array_append_new(src, json_pack("{s:s, s:s, s:f, s:s}", "name", m->sources[k].name,
                                             "path", abs_dirs[k], "weight", m->sources[k].weight,
                                             "manifest_xxh3", mx));
        json_array_append_new(cnt, json_integer((json_int_t)cursor->count[k]));
        json_array_append_new(pc, json_integer((json_int_t)cursor->phase_count[k]));
    }
    for (uint32_t i = 0; i < m->n_changes && !rc; i++) {
        json_t *ws = json_object();
        rc = change_weights(m, &m->changes[i], w);
        for (uint32_t k = 0; k < m->n_sources && !rc; k++)
            if (w[k] > 0) json_object_set_new(ws, m->sources[k].name, json_real(w[k]));
        json_array_append_new(sch, json_pack("{s:I, s:o}", "step", (json_int_t)m->changes[i].step,
                                             "weights", ws));
    }
    json_object_set_new(o, "sources", src);
    json_object_set_new(o, "schedule", sch);
    json_object_set_new(o, "cursor", json_pack("{s:I, s:o, s:o}", "sample", (json_int_t)cursor->sample,
                                               "count", cnt, "phase_count", pc));
    char *t = rc ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!rc && (!t || strlen(t) >= cap))
        rc = tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                      "the mixture's record for the checkpoint is %s (at most %zu bytes): use "
                      "shorter dataset paths or fewer sources", t ? "too long" : "out of memory",
                      cap - 1);
    if (!rc) memcpy(out, t, strlen(t) + 1);
    free(t);
    return rc;
}
