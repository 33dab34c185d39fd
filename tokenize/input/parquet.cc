/* parquet.cc - tokenize/parquet.h over Apache Arrow's C++ Parquet reader
 * (libparquet from the pyarrow wheel; its headers need C++20). Arrow reports
 * damage by throwing parquet::ParquetException (or std::exception): every
 * entry point catches and turns it into a TKS_ERR_INPUT naming the file and
 * the row group. Only the low-level reader is used (ParquetFileReader and
 * TypedColumnReader<ByteArrayType>): rows come out as byte arrays, dictionary
 * pages decoded by the reader, without building Arrow arrays. */
#include <parquet/column_reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#include <parquet/schema.h>
#include <arrow/util/config.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "common/tks.h"
#include "tokenize/input/parquet.h"

namespace {
constexpr int kBatch = 1024; /* rows per ReadBatch */
}

struct tks_pq {
    std::string path, column;
    std::unique_ptr<parquet::ParquetFileReader> reader;
    int col = -1;           /* leaf column index */
    int16_t max_def = 0;    /* 0: required column, 1: optional */
    std::vector<tks_pq_group> groups;
    /* the row group being read */
    size_t group = 0;
    std::shared_ptr<parquet::ColumnReader> cr;
    int64_t rows_left = 0;  /* rows the footer promises still to come */
    int16_t def[kBatch];
    parquet::ByteArray val[kBatch];
    int64_t n_levels = 0, at = 0, n_vals = 0, vi = 0;
};

static int fail_input(const tks_pq *p, const char *what, const char *why) {
    if (p->group < p->groups.size() && p->cr)
        return tks_fail(TKS_ERR_INPUT, p->path.c_str(), TKS_NONE, TKS_NONE,
                        "%s: Parquet row group %zu, column '%s': %s: %s; the file is damaged: "
                        "write it again, or remove it from the inputs, then build again",
                        p->path.c_str(), p->group, p->column.c_str(), what, why);
    return tks_fail(TKS_ERR_INPUT, p->path.c_str(), TKS_NONE, TKS_NONE,
                    "%s: %s: %s; the file is not a readable Parquet file: write it again, or use "
                    "--on-bad-input skip to leave it out",
                    p->path.c_str(), what, why);
}

/* "name (type)" of every top-level field, for the message of a bad column. */
static std::string columns_of(const parquet::SchemaDescriptor *s) {
    std::string out;
    const parquet::schema::GroupNode *root = s->group_node();
    for (int i = 0; i < root->field_count(); i++) {
        const parquet::schema::Node *f = root->field(i).get();
        if (i) out += ", ";
        out += f->name();
        out += " (";
        if (f->is_group()) {
            out += "nested";
        } else {
            const auto *pn = static_cast<const parquet::schema::PrimitiveNode *>(f);
            out += parquet::TypeToString(pn->physical_type());
            if (f->logical_type() && !f->logical_type()->is_none()) {
                out += ' '; /* (not " " + ...: g++ 12 -O3 warns wrongly on that temporary, -Wrestrict) */
                out += f->logical_type()->ToString();
            }
        }
        if (f->is_repeated()) out += ", repeated";
        out += ")";
    }
    return out;
}

/* The leaf of `column`, or an error naming what the file has. */
static int find_column(tks_pq *p) {
    const parquet::SchemaDescriptor *s = p->reader->metadata()->schema();
    const parquet::schema::GroupNode *root = s->group_node();
    int fi = root->FieldIndex(p->column), same = 0;
    for (int i = 0; i < root->field_count(); i++) same += root->field(i)->name() == p->column;
    const char *why = nullptr;
    std::string type;
    if (fi < 0) {
        why = "is missing";
    } else if (same > 1) { /* pyarrow refuses the name as ambiguous too: no column is picked for the user */
        return tks_fail(TKS_ERR_INPUT, p->path.c_str(), TKS_NONE, TKS_NONE,
                        "%s: column '%s' is ambiguous: %d top-level columns have that name (the file's "
                        "columns: %s); write the file again with distinct column names, or name another "
                        "column with --parquet-column NAME",
                        p->path.c_str(), p->column.c_str(), same, columns_of(s).c_str());
    } else {
        const parquet::schema::Node *f = root->field(fi).get();
        if (f->is_group()) {
            why = "is nested (a struct, list or map)";
        } else if (f->is_repeated()) {
            why = "is repeated";
        } else {
            const auto *pn = static_cast<const parquet::schema::PrimitiveNode *>(f);
            const auto &lt = f->logical_type();
            bool text_ok = !lt || lt->is_none() || lt->is_string() || lt->is_JSON() || lt->is_enum();
            if (pn->physical_type() != parquet::Type::BYTE_ARRAY || !text_ok) {
                type = parquet::TypeToString(pn->physical_type());
                if (lt && !lt->is_none()) {
                    type += ' ';
                    type += lt->ToString();
                }
                why = "is of another type";
            }
        }
    }
    if (why)
        return tks_fail(TKS_ERR_INPUT, p->path.c_str(), TKS_NONE, TKS_NONE,
                        "%s: column '%s' %s%s%s: the documents' column must be a string, large_string, "
                        "binary or large_binary column at the top level; the file's columns: %s; name "
                        "the text column with --parquet-column NAME",
                        p->path.c_str(), p->column.c_str(), why, type.empty() ? "" : ": ", type.c_str(),
                        columns_of(s).c_str());
    const parquet::schema::Node *leaf = root->field(fi).get();
    p->col = s->ColumnIndex(*leaf);
    p->max_def = s->Column(p->col)->max_definition_level();
    return 0;
}

static int read_footer(tks_pq *p) {
    std::shared_ptr<parquet::FileMetaData> md = p->reader->metadata();
    int rc = find_column(p);
    if (rc) return rc;
    struct stat st;
    if (stat(p->path.c_str(), &st) != 0)
        return tks_fail(TKS_ERR_IO, p->path.c_str(), TKS_NONE, TKS_NONE, "cannot stat %s: %s", p->path.c_str(),
                        strerror(errno));
    for (int g = 0; g < md->num_row_groups(); g++) {
        std::unique_ptr<parquet::RowGroupMetaData> rg = md->RowGroup(g);
        std::unique_ptr<parquet::ColumnChunkMetaData> cc = rg->ColumnChunk(p->col);
        int64_t start = cc->data_page_offset();
        if (cc->has_dictionary_page() && cc->dictionary_page_offset() > 0 &&
            cc->dictionary_page_offset() < start)
            start = cc->dictionary_page_offset();
        int64_t len = cc->total_compressed_size();
        if (rg->num_rows() < 0 || start < 0 || len < 0 || cc->total_uncompressed_size() < 0)
            return fail_input(p, "the footer", "negative row count, offset or size");
        if (start > (int64_t)st.st_size || len > (int64_t)st.st_size - start) {
            char why[160];
            snprintf(why, sizeof why, "row group %d's column chunk, bytes %lld to %lld, lies past the end of "
                     "the file (%lld bytes)", g, (long long)start, (long long)(start + len), (long long)st.st_size);
            return fail_input(p, "the footer", why);
        }
        tks_pq_group gr = {(uint64_t)rg->num_rows(), (uint64_t)cc->total_uncompressed_size(),
                           (uint64_t)start, (uint64_t)start + (uint64_t)len};
        p->groups.push_back(gr);
    }
    return 0;
}

extern "C" int tks_pq_available(void) { return 1; }

extern "C" const char *tks_pq_version(void) { return ARROW_VERSION_STRING; }

extern "C" int tks_pq_open(const char *path, const char *column, tks_pq **out) {
    *out = nullptr;
    tks_pq *p = new (std::nothrow) tks_pq();
    if (!p) return tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "out of memory");
    int rc = 0;
    try {
        p->path = path;
        p->column = column && *column ? column : "text";
        parquet::ReaderProperties props = parquet::default_reader_properties();
        props.set_page_checksum_verification(true);
        p->reader = parquet::ParquetFileReader::OpenFile(p->path, false, props);
        rc = read_footer(p);
    } catch (const std::bad_alloc &) {
        rc = tks_fail(TKS_ERR_NOMEM, path, TKS_NONE, TKS_NONE, "%s: out of memory reading the Parquet footer", path);
    } catch (const std::exception &e) {
        rc = fail_input(p, "cannot read the Parquet footer", e.what());
    }
    if (rc) {
        delete p;
        return rc;
    }
    *out = p;
    return 0;
}

extern "C" size_t tks_pq_n_groups(const tks_pq *p) { return p->groups.size(); }

extern "C" const tks_pq_group *tks_pq_groups(const tks_pq *p) { return p->groups.data(); }

extern "C" int tks_pq_start(tks_pq *p, size_t g) {
    if (g >= p->groups.size())
        return tks_fail(TKS_ERR_ARG, p->path.c_str(), TKS_NONE, TKS_NONE,
                        "%s: row group %zu of %zu", p->path.c_str(), g, p->groups.size());
    p->group = g;
    p->cr.reset();
    p->n_levels = p->at = p->n_vals = p->vi = 0;
    try {
        p->cr = p->reader->RowGroup((int)g)->Column(p->col);
        p->rows_left = (int64_t)p->groups[g].rows;
    } catch (const std::exception &e) {
        p->cr.reset();
        p->group = g;
        return tks_fail(TKS_ERR_INPUT, p->path.c_str(), TKS_NONE, TKS_NONE,
                        "%s: Parquet row group %zu: %s; the file is damaged: write it again, or "
                        "remove it from the inputs, then build again",
                        p->path.c_str(), g, e.what());
    }
    return 0;
}

extern "C" int tks_pq_next(tks_pq *p, const char **s, size_t *n, int *is_null) {
    if (!p->cr) return 0;
    if (p->at == p->n_levels) {
        if (p->rows_left == 0) return 0;
        auto *br = static_cast<parquet::ByteArrayReader *>(p->cr.get());
        try {
            int64_t want = p->rows_left < kBatch ? p->rows_left : kBatch, vals = 0;
            p->n_levels = br->ReadBatch(want, p->max_def ? p->def : nullptr, nullptr, p->val, &vals);
            p->n_vals = vals;
        } catch (const std::bad_alloc &) {
            return tks_fail(TKS_ERR_NOMEM, p->path.c_str(), TKS_NONE, TKS_NONE,
                            "%s: Parquet row group %zu: out of memory", p->path.c_str(), p->group);
        } catch (const std::exception &e) {
            return fail_input(p, "cannot read a page", e.what());
        }
        p->at = p->vi = 0;
        if (p->n_levels <= 0)
            return fail_input(p, "the column chunk ends early",
                              (std::to_string(p->rows_left) + " of the rows the footer declares are missing").c_str());
        if (p->n_levels > p->rows_left || p->n_vals > p->n_levels)
            return fail_input(p, "the pages", "hold more values than the footer declares");
        p->rows_left -= p->n_levels;
    }
    int null = p->max_def && p->def[p->at] < p->max_def;
    p->at++;
    *is_null = null;
    if (null) {
        *s = "";
        *n = 0;
        return 1;
    }
    if (p->vi >= p->n_vals) return fail_input(p, "the pages", "fewer values than definition levels");
    const parquet::ByteArray &v = p->val[p->vi++];
    *s = v.len ? reinterpret_cast<const char *>(v.ptr) : "";
    *n = v.len;
    return 1;
}

extern "C" void tks_pq_close(tks_pq *p) { delete p; }
