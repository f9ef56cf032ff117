/* tabletopic._batchjson: the records of Kafka v2 record batches whose values are flat JSON
 * objects, read straight into Arrow buffers, without holding the GIL.
 *
 * decode(bodies, min_offset, names, kinds) takes the records sections of batches (each
 * (buffer, base_offset, base_timestamp, max_timestamp, log_append_time, record_count), the
 * buffer uncompressed), the lowest offset wanted, the table's value columns (UTF-8 names)
 * and their kinds (0 long, 1 double, 2 string, 3 boolean). It returns the Arrow buffers of
 * the records' offsets, timestamps (ms), keys and value columns, or None when it does not
 * take the input as it is: anything but plain, well-formed records (header keys UTF-8) whose
 * values are JSON objects holding only those columns, each of its type or null, with no
 * escaped key, no duplicate key, no number Arrow would refuse or round. It is a fast path
 * only: on None the caller converts with the Python path (tabletopic.convert), which decides
 * what every record is (row, dead letter, a new column, a corrupt batch). Where it returns
 * buffers, they hold what that path builds, value for value (tests/unit/test_batchjson.py
 * compares the two on generated and hostile input).
 *
 * Every length read from the input is checked against what is left of it before it is used;
 * every loop is bounded by the input's size; output grows with the input only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <locale.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __APPLE__
#include <xlocale.h>
#endif

enum { KIND_LONG = 0, KIND_DOUBLE = 1, KIND_STRING = 2, KIND_BOOL = 3 };
enum { OK = 0, REFUSE = 1, NOMEM = 2 };
#define MAX_COLUMNS 4096
#define EXACT_DOUBLE 9007199254740992LL /* 2**53: Arrow casts longs up to this to doubles */

static locale_t c_locale;

/* -- growing buffers ------------------------------------------------------------------- */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t more) {
    if (more > SIZE_MAX - b->len) return NOMEM;
    size_t need = b->len + more;
    if (need <= b->cap) return OK;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return NOMEM;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL) return NOMEM;
    b->p = p;
    b->cap = cap;
    return OK;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (n > b->cap - b->len && buf_reserve(b, n)) return NOMEM;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return OK;
}

/* a bitmap (Arrow's validity and boolean layout: bit i of byte i / 8, least significant first) */
typedef struct {
    Buf b;
    int64_t n, ones;
} Bits;

static inline int bits_push(Bits *m, int bit) {
    if (m->n % 8 == 0) {
        uint8_t zero = 0;
        if (buf_put(&m->b, &zero, 1)) return NOMEM;
    }
    if (bit) {
        m->b.p[m->n / 8] |= (uint8_t)(1u << (m->n % 8));
        m->ones++;
    }
    m->n++;
    return OK;
}

/* int32 offsets of a string/binary column: one more after each value */
static inline int push_offset(Buf *offsets, size_t data_len) {
    if (data_len > INT32_MAX) return REFUSE;
    int32_t o = (int32_t)data_len;
    return buf_put(offsets, &o, sizeof o);
}

typedef struct {
    const char *name;
    size_t name_len;
    int kind;
    Bits valid;
    Buf data;    /* int64 / double values, string bytes */
    Bits bools;  /* boolean values */
    Buf offsets; /* string offsets */
    int64_t seen_row;
} Column;

typedef struct {
    Buf offsets, timestamps, key_offsets, key_data;
    Bits key_valid;
    /* headers: each row's first header (int32), their keys (UTF-8) and values */
    Buf header_offsets, header_key_offsets, header_keys, header_value_offsets, header_values;
    Bits header_value_valid;
    int64_t rows, headers;
    Column *cols;
    int ncols;
} Out;

/* -- one value of a column ------------------------------------------------------------- */
static int push_null(Column *c) {
    if (bits_push(&c->valid, 0)) return NOMEM;
    switch (c->kind) {
    case KIND_LONG:
    case KIND_DOUBLE: {
        int64_t zero = 0;
        return buf_put(&c->data, &zero, sizeof zero);
    }
    case KIND_BOOL:
        return bits_push(&c->bools, 0);
    default:
        return push_offset(&c->offsets, c->data.len);
    }
}

static inline int is_ws(uint8_t ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }
static inline int is_digit(uint8_t ch) { return ch >= '0' && ch <= '9'; }

/* The length of the well-formed UTF-8 sequence at s (n bytes left), 0 if it is not one (as
 * Python's strict UTF-8 codec: no overlong forms, no surrogates, nothing past U+10FFFF). */
static size_t utf8_seq(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (n < 3) return 0;
        uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c < 0xF5) {
        if (n < 4) return 0;
        uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 ? 4
                                                                                         : 0;
    }
    return 0;
}

static int hex4(const uint8_t *s, size_t n, size_t i, uint32_t *out) {
    if (n - i < 4) return REFUSE;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        uint8_t ch = s[i + k];
        v <<= 4;
        if (is_digit(ch)) v |= (uint32_t)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (uint32_t)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') v |= (uint32_t)(ch - 'A' + 10);
        else return REFUSE;
    }
    *out = v;
    return OK;
}

static int put_utf8(Buf *b, uint32_t cp) {
    uint8_t u[4];
    size_t k;
    if (cp < 0x80) { u[0] = (uint8_t)cp; k = 1; }
    else if (cp < 0x800) { u[0] = (uint8_t)(0xC0 | (cp >> 6)); u[1] = (uint8_t)(0x80 | (cp & 0x3F)); k = 2; }
    else if (cp < 0x10000) {
        u[0] = (uint8_t)(0xE0 | (cp >> 12)); u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp & 0x3F)); k = 3;
    } else {
        u[0] = (uint8_t)(0xF0 | (cp >> 18)); u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (uint8_t)(0x80 | (cp & 0x3F)); k = 4;
    }
    return buf_put(b, u, k);
}

/* Whether any of 8 bytes ends a plain run of a string: a quote, a backslash, a control
 * character or a byte of a multi-byte UTF-8 sequence (never a false negative; a false
 * positive costs only the byte-wise loop). */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline uint64_t special8(uint64_t v) {
    uint64_t quote = v ^ (ONES * '"'), backslash = v ^ (ONES * '\\');
    return (v | ((v - ONES * 0x20) & ~v) | ((quote - ONES) & ~quote) |
            ((backslash - ONES) & ~backslash)) & HIGHS;
}

/* A JSON string starting after its opening quote at *i, decoded into b. */
static int parse_string(const uint8_t *s, size_t n, size_t *i, Buf *b) {
    size_t p = *i;
    for (;;) {
        size_t run = p;
        uint64_t v;
        while (n - p >= 8 && (memcpy(&v, s + p, 8), !special8(v))) p += 8;
        while (p < n && s[p] >= 0x20 && s[p] < 0x80 && s[p] != '"' && s[p] != '\\') p++;
        if (buf_put(b, s + run, p - run)) return NOMEM;
        if (p >= n) return REFUSE;
        uint8_t ch = s[p];
        if (ch == '"') {
            *i = p + 1;
            return OK;
        }
        if (ch < 0x20) return REFUSE; /* a raw control character: not JSON */
        if (ch >= 0x80) {
            size_t k = utf8_seq(s + p, n - p);
            if (k == 0) return REFUSE;
            if (buf_put(b, s + p, k)) return NOMEM;
            p += k;
            continue;
        }
        /* an escape */
        if (++p >= n) return REFUSE;
        uint8_t e = s[p++];
        uint8_t c;
        switch (e) {
        case '"': c = '"'; break;
        case '\\': c = '\\'; break;
        case '/': c = '/'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(s, n, p, &cp)) return REFUSE;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return REFUSE; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {              /* a pair, or refused */
                uint32_t lo;
                if (n - p < 6 || s[p] != '\\' || s[p + 1] != 'u' || hex4(s, n, p + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return REFUSE;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (put_utf8(b, cp)) return NOMEM;
            continue;
        }
        default:
            return REFUSE;
        }
        if (buf_put(b, &c, 1)) return NOMEM;
    }
}

/* The double of a decimal number (its text without the sign) when its digits and exponent
 * are few enough for one correctly rounded IEEE operation to give it (Clinger's fast path:
 * at most 15 significant digits, a power of ten up to 1e22, both exact doubles); 0 when not
 * (strtod then). */
static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                               1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                               1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
static int exact_double(const uint8_t *s, size_t n, double *out) {
    uint64_t m = 0;
    int sig = 0, exp10 = 0, frac = 0;
    size_t i = 0;
    for (; i < n; i++) {
        uint8_t ch = s[i];
        if (ch == '.') { frac = 1; continue; }
        if (!is_digit(ch)) break;
        if (m == 0 && ch == '0') { if (frac) exp10--; continue; } /* a leading zero */
        if (++sig > 15) return 0;
        m = m * 10 + (uint64_t)(ch - '0');
        if (frac) exp10--;
    }
    if (i < n) { /* e or E, a sign, digits (the grammar was checked) */
        i++;
        int eneg = 0, e = 0;
        if (s[i] == '+' || s[i] == '-') eneg = s[i++] == '-';
        for (; i < n; i++) {
            if (e > 1000) return 0;
            e = e * 10 + (s[i] - '0');
        }
        exp10 += eneg ? -e : e;
    }
    if (m == 0) { *out = 0.0; return 1; }
    if (exp10 < -22 || exp10 > 22) return 0;
    *out = exp10 < 0 ? (double)m / POW10[-exp10] : (double)m * POW10[exp10];
    return 1;
}

/* A JSON number at *i into a long (is_int) or a double. */
static int parse_number(const uint8_t *s, size_t n, size_t *i, int *is_int, int64_t *lv,
                        double *dv) {
    size_t p = *i, start = p;
    int neg = 0;
    if (p < n && s[p] == '-') { neg = 1; p++; }
    if (p >= n) return REFUSE;
    size_t digits = p;
    if (s[p] == '0') p++;
    else if (s[p] >= '1' && s[p] <= '9') while (p < n && is_digit(s[p])) p++;
    else return REFUSE;
    size_t int_end = p;
    *is_int = 1;
    if (p < n && s[p] == '.') {
        *is_int = 0;
        p++;
        if (p >= n || !is_digit(s[p])) return REFUSE;
        while (p < n && is_digit(s[p])) p++;
    }
    if (p < n && (s[p] == 'e' || s[p] == 'E')) {
        *is_int = 0;
        p++;
        if (p < n && (s[p] == '+' || s[p] == '-')) p++;
        if (p >= n || !is_digit(s[p])) return REFUSE;
        while (p < n && is_digit(s[p])) p++;
    }
    if (*is_int) {
        if (int_end - digits > 19) return REFUSE;
        uint64_t u = 0;
        for (size_t k = digits; k < int_end; k++) u = u * 10 + (uint64_t)(s[k] - '0');
        if (neg) {
            if (u > (uint64_t)INT64_MAX + 1) return REFUSE;
            *lv = u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u;
        } else {
            if (u > (uint64_t)INT64_MAX) return REFUSE;
            *lv = (int64_t)u;
        }
    } else if (exact_double(s + digits, p - digits, dv)) {
        if (neg) *dv = -*dv;
    } else {
        char text[64];
        size_t len = p - start;
        if (len >= sizeof text) return REFUSE;
        memcpy(text, s + start, len);
        text[len] = 0;
        char *end;
        errno = 0;
        double d = strtod_l(text, &end, c_locale);
        if (errno != 0 || end != text + len) return REFUSE; /* out of range, or not all read */
        *dv = d;
    }
    *i = p;
    return OK;
}

static int literal(const uint8_t *s, size_t n, size_t *i, const char *word) {
    size_t k = strlen(word);
    if (n - *i < k || memcmp(s + *i, word, k) != 0) return REFUSE;
    *i += k;
    return OK;
}

/* One value of column c at *i. */
static int parse_field(const uint8_t *s, size_t n, size_t *i, Column *c) {
    if (*i >= n) return REFUSE;
    if (s[*i] == 'n') {
        if (literal(s, n, i, "null")) return REFUSE;
        return push_null(c);
    }
    int rc;
    switch (c->kind) {
    case KIND_LONG:
    case KIND_DOUBLE: {
        int is_int;
        int64_t lv = 0;
        double dv = 0;
        if (s[*i] != '-' && !is_digit(s[*i])) return REFUSE;
        if ((rc = parse_number(s, n, i, &is_int, &lv, &dv))) return rc;
        if (c->kind == KIND_LONG) {
            if (!is_int) return REFUSE;
            if (buf_put(&c->data, &lv, sizeof lv)) return NOMEM;
        } else {
            if (is_int) {
                if (lv > EXACT_DOUBLE || lv < -EXACT_DOUBLE) return REFUSE;
                dv = (double)lv;
            }
            if (buf_put(&c->data, &dv, sizeof dv)) return NOMEM;
        }
        return bits_push(&c->valid, 1);
    }
    case KIND_BOOL: {
        int v;
        if (s[*i] == 't') { if (literal(s, n, i, "true")) return REFUSE; v = 1; }
        else if (s[*i] == 'f') { if (literal(s, n, i, "false")) return REFUSE; v = 0; }
        else return REFUSE;
        if (bits_push(&c->bools, v)) return NOMEM;
        return bits_push(&c->valid, 1);
    }
    default: /* string */
        if (s[*i] != '"') return REFUSE;
        (*i)++;
        if ((rc = parse_string(s, n, i, &c->data))) return rc;
        if ((rc = push_offset(&c->offsets, c->data.len))) return rc;
        return bits_push(&c->valid, 1);
    }
}

static inline void skip_ws(const uint8_t *s, size_t n, size_t *i) {
    while (*i < n && is_ws(s[*i])) (*i)++;
}

static inline int same(const char *name, const uint8_t *key, size_t n) {
    for (size_t k = 0; k < n; k++)
        if ((uint8_t)name[k] != key[k]) return 0;
    return 1;
}

/* One record's value (a JSON object) as row `row` of the columns; NULL: a tombstone. */
static int parse_row(Out *o, const uint8_t *s, size_t n, int64_t row) {
    int rc, guess = 0;
    if (s != NULL) {
        size_t i = 0;
        skip_ws(s, n, &i);
        if (i >= n || s[i] != '{') return REFUSE;
        i++;
        skip_ws(s, n, &i);
        if (i < n && s[i] == '}') i++;
        else {
            for (;;) {
                if (i >= n || s[i] != '"') return REFUSE;
                size_t k0 = ++i;
                while (i < n && s[i] != '"') {
                    if (s[i] == '\\' || s[i] < 0x20) return REFUSE;
                    i++;
                }
                if (i >= n) return REFUSE;
                size_t klen = i - k0;
                i++;
                Column *c = NULL; /* the column after the last one first: keys keep an order */
                for (int k = 0; k < o->ncols; k++) {
                    Column *x = &o->cols[(guess + k) % o->ncols];
                    if (x->name_len == klen && same(x->name, s + k0, klen)) {
                        c = x;
                        guess = (int)(x - o->cols) + 1;
                        break;
                    }
                }
                if (c == NULL || c->seen_row == row) return REFUSE; /* unknown or twice */
                c->seen_row = row;
                skip_ws(s, n, &i);
                if (i >= n || s[i] != ':') return REFUSE;
                i++;
                skip_ws(s, n, &i);
                if ((rc = parse_field(s, n, &i, c))) return rc;
                skip_ws(s, n, &i);
                if (i >= n) return REFUSE;
                if (s[i] == '}') { i++; break; }
                if (s[i] != ',') return REFUSE;
                i++;
                skip_ws(s, n, &i);
            }
        }
        skip_ws(s, n, &i);
        if (i != n) return REFUSE;
    }
    for (int k = 0; k < o->ncols; k++) {
        Column *c = &o->cols[k];
        if (c->seen_row != row && (rc = push_null(c))) return rc;
    }
    return OK;
}

/* -- record batches -------------------------------------------------------------------- */
typedef struct {
    Py_buffer view;
    int64_t base_offset, base_timestamp, max_timestamp, count;
    int log_append;
} Batch;

static inline int varlong(const uint8_t *p, size_t end, size_t *pos, int64_t *out) {
    if (*pos < end && p[*pos] < 0x80) { /* one byte: most fields */
        uint64_t v = p[(*pos)++];
        *out = (int64_t)((v >> 1) ^ (0 - (v & 1)));
        return OK;
    }
    uint64_t v = 0;
    for (int k = 0; k < 10; k++) {
        if (*pos >= end) return REFUSE;
        uint8_t b = p[(*pos)++];
        if (k == 9 && b > 1) return REFUSE; /* beyond 64 bits */
        v |= (uint64_t)(b & 0x7F) << (7 * k);
        if (!(b & 0x80)) {
            *out = (int64_t)((v >> 1) ^ (0 - (v & 1)));
            return OK;
        }
    }
    return REFUSE;
}

/* a length or count field: -1 (null) up to what is left before `end` */
static inline int length(const uint8_t *p, size_t end, size_t *pos, int64_t *out) {
    if (varlong(p, end, pos, out)) return REFUSE;
    if (*out < -1 || *out > (int64_t)(end - *pos)) return REFUSE;
    return OK;
}

static int decode_batch(Out *o, const Batch *b, int64_t min_offset) {
    const uint8_t *p = b->view.buf;
    size_t len = (size_t)b->view.len, pos = 0;
    int64_t last_delta = -1;
    int rc;
    for (int64_t r = 0; r < b->count; r++) {
        int64_t rlen, ts_delta, off_delta, klen, vlen, headers;
        rc = OK;
        if (length(p, len, &pos, &rlen) || rlen < 1) return REFUSE;
        size_t end = pos + (size_t)rlen;
        if (p[pos++] & 0x80) return REFUSE; /* attributes: one byte to every parser */
        if (varlong(p, end, &pos, &ts_delta) || varlong(p, end, &pos, &off_delta))
            return REFUSE;
        /* offsets ascend within a batch (gaps where compaction removed records) */
        if (off_delta <= last_delta || off_delta > INT32_MAX) return REFUSE;
        last_delta = off_delta;
        if (length(p, end, &pos, &klen)) return REFUSE;
        const uint8_t *key = klen < 0 ? NULL : p + pos;
        pos += klen < 0 ? 0 : (size_t)klen;
        if (length(p, end, &pos, &vlen)) return REFUSE;
        const uint8_t *value = vlen < 0 ? NULL : p + pos;
        pos += vlen < 0 ? 0 : (size_t)vlen;
        int64_t offset, timestamp;
        if (__builtin_add_overflow(b->base_offset, off_delta, &offset)) return REFUSE;
        if (b->log_append) timestamp = b->max_timestamp;
        else if (__builtin_add_overflow(b->base_timestamp, ts_delta, &timestamp)) return REFUSE;
        int keep = offset >= min_offset;
        /* headers: a count, then (key, value) pairs of 2 bytes at least */
        if (length(p, end, &pos, &headers) || headers < 0 || headers > (int64_t)(end - pos) / 2)
            return REFUSE;
        for (int64_t h = 0; h < headers; h++) {
            int64_t hklen, hvlen;
            if (length(p, end, &pos, &hklen) || hklen < 0) return REFUSE;
            for (size_t at = pos, k; at < pos + (size_t)hklen; at += k) /* UTF-8, or declined */
                if ((k = utf8_seq(p + at, pos + (size_t)hklen - at)) == 0) return REFUSE;
            if (keep && (buf_put(&o->header_keys, p + pos, (size_t)hklen) ||
                         (rc = push_offset(&o->header_key_offsets, o->header_keys.len))))
                return rc ? rc : NOMEM;
            pos += (size_t)hklen;
            if (length(p, end, &pos, &hvlen)) return REFUSE;
            if (keep) {
                if (bits_push(&o->header_value_valid, hvlen >= 0) ||
                    (hvlen > 0 && buf_put(&o->header_values, p + pos, (size_t)hvlen)))
                    return NOMEM;
                if ((rc = push_offset(&o->header_value_offsets, o->header_values.len))) return rc;
                o->headers++;
            }
            pos += hvlen < 0 ? 0 : (size_t)hvlen;
        }
        if (pos != end) return REFUSE;
        if (!keep) continue;
        if ((rc = push_offset(&o->header_offsets, (size_t)o->headers))) return rc;
        if (buf_put(&o->offsets, &offset, sizeof offset) ||
            buf_put(&o->timestamps, &timestamp, sizeof timestamp) ||
            bits_push(&o->key_valid, key != NULL))
            return NOMEM;
        if (key != NULL && buf_put(&o->key_data, key, (size_t)klen)) return NOMEM;
        if ((rc = push_offset(&o->key_offsets, o->key_data.len))) return rc;
        if ((rc = parse_row(o, value, value == NULL ? 0 : (size_t)vlen, o->rows))) return rc;
        o->rows++;
    }
    return pos == len ? OK : REFUSE; /* bytes after the last record: left to the Python path */
}

/* -- to Python ------------------------------------------------------------------------- */
/* A buffer the decoder filled, handed to Python as it is (no copy): read-only through the
 * buffer protocol, freed with the last reference (pyarrow's py_buffer keeps one). */
typedef struct {
    PyObject_HEAD
    uint8_t *p;
    Py_ssize_t len;
} Block;

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->p, b->len, 1, flags);
}

static void block_dealloc(PyObject *self) {
    free(((Block *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static Py_ssize_t block_length(PyObject *self) { return ((Block *)self)->len; }

static PyBufferProcs block_as_buffer = {block_getbuffer, NULL};
static PySequenceMethods block_as_sequence = {.sq_length = block_length};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tabletopic._batchjson.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = block_dealloc,
    .tp_as_sequence = &block_as_sequence,
    .tp_as_buffer = &block_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes the decoder wrote, read-only (the buffer protocol).",
};

/* b's bytes as a Block (b gives its memory up) */
static PyObject *bytes_of(Buf *b) {
    if (b->p == NULL && buf_reserve(b, 1)) return PyErr_NoMemory(); /* never a NULL buffer */
    Block *out = PyObject_New(Block, &BlockType);
    if (out == NULL) return NULL;
    out->p = b->p;
    out->len = (Py_ssize_t)b->len;
    if (b->cap > b->len + b->len / 4 + 4096) { /* much unused: give it back */
        uint8_t *q = realloc(b->p, b->len ? b->len : 1);
        if (q != NULL) out->p = q;
    }
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)out;
}

/* a validity bitmap, or None when every row is valid (as Arrow builds it then) */
static PyObject *validity(Bits *m) {
    if (m->ones == m->n) Py_RETURN_NONE;
    return bytes_of(&m->b);
}

static PyObject *result(Out *o) {
    PyObject *cols = PyList_New(o->ncols);
    if (cols == NULL) return NULL;
    for (int k = 0; k < o->ncols; k++) {
        Column *c = &o->cols[k];
        PyObject *item;
        if (c->kind == KIND_STRING)
            item = Py_BuildValue("(NLNN)", validity(&c->valid), (long long)(c->valid.n - c->valid.ones),
                                 bytes_of(&c->offsets), bytes_of(&c->data));
        else
            item = Py_BuildValue("(NLN)", validity(&c->valid), (long long)(c->valid.n - c->valid.ones),
                                 bytes_of(c->kind == KIND_BOOL ? &c->bools.b : &c->data));
        if (item == NULL) {
            Py_DECREF(cols);
            return NULL;
        }
        PyList_SET_ITEM(cols, k, item);
    }
    PyObject *headers;
    if (o->headers == 0) headers = Py_NewRef(Py_None); /* no row has any: empty lists */
    else
        headers = Py_BuildValue(
            "(LNNNNLNN)", (long long)o->headers, bytes_of(&o->header_offsets),
            bytes_of(&o->header_key_offsets), bytes_of(&o->header_keys),
            validity(&o->header_value_valid),
            (long long)(o->header_value_valid.n - o->header_value_valid.ones),
            bytes_of(&o->header_value_offsets), bytes_of(&o->header_values));
    if (headers == NULL) {
        Py_DECREF(cols);
        return NULL;
    }
    return Py_BuildValue("(LNNNLNNNN)", (long long)o->rows, bytes_of(&o->offsets),
                         bytes_of(&o->timestamps), validity(&o->key_valid),
                         (long long)(o->key_valid.n - o->key_valid.ones),
                         bytes_of(&o->key_offsets), bytes_of(&o->key_data), headers, cols);
}

static void free_out(Out *o) {
    free(o->offsets.p); free(o->timestamps.p); free(o->key_offsets.p); free(o->key_data.p);
    free(o->key_valid.b.p);
    free(o->header_offsets.p); free(o->header_key_offsets.p); free(o->header_keys.p);
    free(o->header_value_offsets.p); free(o->header_values.p); free(o->header_value_valid.b.p);
    for (int k = 0; o->cols != NULL && k < o->ncols; k++) {
        Column *c = &o->cols[k];
        free(c->valid.b.p); free(c->data.p); free(c->bools.b.p); free(c->offsets.p);
    }
    free(o->cols);
}

static int presize(Out *o, size_t rows) {
    size_t bitmap = rows / 8 + 1;
    if (buf_reserve(&o->offsets, rows * 8) || buf_reserve(&o->timestamps, rows * 8) ||
        buf_reserve(&o->key_offsets, rows * 4) || buf_reserve(&o->key_valid.b, bitmap) ||
        buf_reserve(&o->header_offsets, rows * 4))
        return NOMEM;
    for (int k = 0; k < o->ncols; k++) {
        Column *c = &o->cols[k];
        if (buf_reserve(&c->valid.b, bitmap)) return NOMEM;
        if (c->kind == KIND_LONG || c->kind == KIND_DOUBLE) {
            if (buf_reserve(&c->data, rows * 8)) return NOMEM;
        } else if (c->kind == KIND_BOOL) {
            if (buf_reserve(&c->bools.b, bitmap)) return NOMEM;
        } else if (buf_reserve(&c->offsets, rows * 4)) {
            return NOMEM;
        }
    }
    return OK;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *bodies, *names, *kinds;
    long long min_offset;
    if (!PyArg_ParseTuple(args, "O!LO!O!:decode", &PyList_Type, &bodies, &min_offset,
                          &PyTuple_Type, &names, &PyTuple_Type, &kinds))
        return NULL;
    Py_ssize_t nb = PyList_GET_SIZE(bodies), nc = PyTuple_GET_SIZE(names);
    if (nc != PyTuple_GET_SIZE(kinds) || nc > MAX_COLUMNS) {
        PyErr_SetString(PyExc_ValueError, "names and kinds differ, or too many columns");
        return NULL;
    }
    Out o = {0};
    o.ncols = (int)nc;
    o.cols = calloc(nc ? (size_t)nc : 1, sizeof(Column));
    Batch *batches = calloc(nb ? (size_t)nb : 1, sizeof(Batch));
    Py_ssize_t held = 0;
    PyObject *ret = NULL;
    int rc = OK;
    if (o.cols == NULL || batches == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < nc; k++) {
        Column *c = &o.cols[k];
        PyObject *name = PyTuple_GET_ITEM(names, k);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, k));
        if (!PyBytes_Check(name) || kind < KIND_LONG || kind > KIND_BOOL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a name not bytes, or an unknown kind");
            goto done;
        }
        c->name = PyBytes_AS_STRING(name); /* `names` outlives the call */
        c->name_len = (size_t)PyBytes_GET_SIZE(name);
        c->kind = (int)kind;
        c->seen_row = -1;
        if (kind == KIND_STRING && push_offset(&c->offsets, 0)) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (push_offset(&o.key_offsets, 0) || push_offset(&o.header_offsets, 0) ||
        push_offset(&o.header_key_offsets, 0) || push_offset(&o.header_value_offsets, 0)) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < nb; held++) {
        Batch *b = &batches[held];
        PyObject *buffer;
        long long base_offset, base_ts, max_ts, count;
        int log_append;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(bodies, held), "OLLLpL:batch", &buffer,
                              &base_offset, &base_ts, &max_ts, &log_append, &count))
            goto done;
        if (PyObject_GetBuffer(buffer, &b->view, PyBUF_SIMPLE) < 0) goto done;
        b->base_offset = base_offset;
        b->base_timestamp = base_ts;
        b->max_timestamp = max_ts;
        b->log_append = log_append;
        b->count = count;
    }
    /* room for every record up front (no copies as they come): a record takes 7 bytes at
       least, so a count the bytes cannot hold reserves no more than they can */
    size_t rows = 0;
    for (Py_ssize_t k = 0; k < nb; k++) {
        size_t fit = (size_t)batches[k].view.len / 7;
        rows += batches[k].count < 0 ? 0 : ((size_t)batches[k].count < fit ? (size_t)batches[k].count : fit);
    }
    if (presize(&o, rows)) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < nb && rc == OK; k++) rc = decode_batch(&o, &batches[k], min_offset);
    Py_END_ALLOW_THREADS
    if (rc == NOMEM) PyErr_NoMemory();
    else if (rc == REFUSE) ret = Py_NewRef(Py_None);
    else ret = result(&o);
done:
    for (Py_ssize_t k = 0; k < held; k++) PyBuffer_Release(&batches[k].view);
    free(batches);
    free_out(&o);
    return ret;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(bodies, min_offset, names, kinds): Arrow buffers of the records, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_batchjson",
    "Kafka record batches of flat JSON objects to Arrow buffers, without the GIL.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__batchjson(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    if (c_locale == (locale_t)0) {
        c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
        if (c_locale == (locale_t)0) return PyErr_NoMemory();
    }
    return PyModule_Create(&module);
}
