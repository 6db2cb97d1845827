/* The round's pricing in C: the numpy code it replaces runs ~40 small array operations on a
 * tree of a few dozen nodes, each a few microseconds of dispatch (and several times that with
 * the CPU's caches cold between rounds), which made pricing the largest part of a round's host
 * time. Five entry points, each the twin of numpy code that stays the reference (and the
 * fallback where this module is not built; tests/test_native_pricing.py compares them):
 *
 *   columns(...)      engine/candidates.py candidate_set + learn/precision.py for_nodes
 *   eq6(...)          learn/acceptance.py _design, _fitted (Eq. 6's softmax with none), _head
 *   tree_values(...)  engine/tree.py path_products, committable, best_first_order,
 *                     the n-gram mask and expected_accepted (Eq. 1)
 *   observe_classes(...)  learn/precision.py SourcePrecision.observe_many's class counts
 *   top_k(...)        engine/sampling.py processed_distribution's top-k of a sampled row
 *
 * The tables (coefficient layout, evidence bins) come from Python once (configure), so the
 * constants live in one place, learn/constants.py and learn/acceptance.py's _Layout. Outputs
 * go into buffers the caller allocates (numpy arrays; no numpy C API, so any numpy works).
 * Built by adaspark_app/native/pricing.py with the Python that loads it.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000 /* the stable ABI of 3.11: one build serves 3.11 and later */
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KIND_PICK 0
#define KIND_SIBLING 1
#define KIND_NGRAM 2
#define NG_COPY 1
#define NG_FOLLOWER 2
#define SLOTS 7
#define EPS 1e-4
#define TABLE_MAX 64

/* configure()'s tables */
static int configured = 0;
static int64_t kind_idx[3][SLOTS];
static int64_t ev_bin[TABLE_MAX], ab_bin[TABLE_MAX], bin_of[TABLE_MAX];
static Py_ssize_t ev_cap, ab_cap, class_cap; /* last index of each table */
static int64_t n_ev, n_above, depth0, ag0, co0, depth_max, n_coef, n_bins;
static double class_prior_weight;

/* ------------------------------------------------------------------ helpers */

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static void release(Buf *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

/* A C-contiguous buffer of at least `bytes` bytes (writable if asked). */
static int get_buf(PyObject *o, Buf *b, Py_ssize_t bytes, int writable, const char *name) {
    if (PyObject_GetBuffer(o, &b->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    b->held = 1;
    if (b->view.len < bytes) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected at least %zd", name, b->view.len, bytes);
        return -1;
    }
    return 0;
}

/* A Candidates' column (a list; any sequence is copied into one) into a C array. */
static PyObject *as_list(PyObject *seq, Py_ssize_t n, const char *name) {
    PyObject *list = PyList_Check(seq) ? (Py_INCREF(seq), seq) : PySequence_List(seq);
    if (!list) return NULL;
    if (PyList_Size(list) != n) {
        PyErr_Format(PyExc_ValueError, "Candidates column %s has %zd rows, expected %zd", name, PyList_Size(list), n);
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

/* A column into `out`: int64 ('i'), double ('f') or a truth byte ('b') per item. */
static int read_column(PyObject *seq, void *out, Py_ssize_t n, const char *name, char type) {
    PyObject *list = as_list(seq, n, name);
    if (!list) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(list, i);
        if (type == 'i') {
            long long v = PyLong_AsLongLong(item);
            if (v == -1 && PyErr_Occurred()) goto fail;
            ((int64_t *)out)[i] = (int64_t)v;
        } else if (type == 'f') {
            double v = PyFloat_AsDouble(item);
            if (v == -1.0 && PyErr_Occurred()) goto fail;
            ((double *)out)[i] = v;
        } else {
            int v = PyObject_IsTrue(item);
            if (v < 0) goto fail;
            ((uint8_t *)out)[i] = (uint8_t)v;
        }
    }
    Py_DECREF(list);
    return 0;
fail:
    Py_DECREF(list);
    return -1;
}

static int read_ints(PyObject *seq, int64_t *out, Py_ssize_t n, const char *name) {
    return read_column(seq, out, n, name, 'i');
}

static inline int64_t clip(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* acceptance._logit: log(p) - log1p(-p), p clipped to [eps, 1 - eps] */
static inline double logit(double p) {
    p = fmin(fmax(p, EPS), 1.0 - EPS);
    return log(p) - log1p(-p);
}

/* ------------------------------------------------------------------ configure */

static int read_table(PyObject *seq, int64_t *out, Py_ssize_t *last, const char *name) {
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 1 || n > TABLE_MAX) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: %zd entries (1..%d)", name, n, TABLE_MAX);
        return -1;
    }
    *last = n - 1;
    return read_ints(seq, out, n, name);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *kidx, *evb, *abb, *bino;
    if (!PyArg_ParseTuple(args, "OOOOLLLLLLLLd", &kidx, &evb, &abb, &bino, &n_ev, &n_above, &depth0, &ag0, &co0,
                          &depth_max, &n_coef, &n_bins, &class_prior_weight))
        return NULL;
    int64_t flat[3 * SLOTS];
    if (read_ints(kidx, flat, 3 * SLOTS, "kind_idx") < 0) return NULL;
    memcpy(kind_idx, flat, sizeof flat);
    if (read_table(evb, ev_bin, &ev_cap, "ev_bin") < 0 || read_table(abb, ab_bin, &ab_cap, "ab_bin") < 0 ||
        read_table(bino, bin_of, &class_cap, "bin_of") < 0)
        return NULL;
    for (Py_ssize_t i = 0; i <= class_cap; i++)
        if (bin_of[i] < 0 || bin_of[i] >= n_bins) {
            PyErr_SetString(PyExc_ValueError, "bin_of: a bin outside 0..n_bins-1");
            return NULL;
        }
    if (n_bins > TABLE_MAX || depth_max < 1) {
        PyErr_SetString(PyExc_ValueError, "configure: n_bins or depth_max out of range");
        return NULL;
    }
    configured = 1;
    Py_RETURN_NONE;
}

static int check_configured(void) {
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "adaspark pricing: configure() was not called");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ columns
 * columns(parent, kind, token, depth, ng_kind, ng_evidence, ng_above, contra_evidence, contra_kind,
 *         h, sigma, r, agreed, class_hits, class_trials, overall, ints, floats, bools) -> None
 *
 * ints (9 x n int64): parent, kind, token, depth, ng_kind, ng_evidence, ng_above, contra_evidence,
 * contra_kind (candidate_set's rows); floats (4 x n float64): h, sigma, r, ng_prec; bools (n):
 * agreed. class_hits / class_trials: SourcePrecision's (3 x classes) counts, overall its value.
 * Raises ValueError as CandidateSet does on a parent that does not precede its child or a bad kind.
 */
static PyObject *columns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cols[13];
    PyObject *o_hits, *o_trials, *o_ints, *o_floats, *o_bools;
    double overall;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOdOOO", &cols[0], &cols[1], &cols[2], &cols[3], &cols[4], &cols[5],
                          &cols[6], &cols[7], &cols[8], &cols[9], &cols[10], &cols[11], &cols[12], &o_hits, &o_trials,
                          &overall, &o_ints, &o_floats, &o_bools))
        return NULL;
    if (check_configured() < 0) return NULL;
    static const char *names[13] = {"parent", "kind", "token", "depth", "ng_kind", "ng_evidence", "ng_above",
                                    "contra_evidence", "contra_kind", "h", "sigma", "r", "agreed"};
    Py_ssize_t n = PySequence_Size(cols[0]);
    if (n < 0) return NULL;
    Py_ssize_t classes = class_cap + 1;
    Buf b[5];
    memset(b, 0, sizeof b);
    PyObject *ret = NULL;
    if (get_buf(o_hits, &b[0], 3 * classes * 8, 0, "class_hits") < 0 ||
        get_buf(o_trials, &b[1], 3 * classes * 8, 0, "class_trials") < 0 ||
        get_buf(o_ints, &b[2], 9 * n * 8, 1, "ints") < 0 || get_buf(o_floats, &b[3], 4 * n * 8, 1, "floats") < 0 ||
        get_buf(o_bools, &b[4], n, 1, "bools") < 0)
        goto done;
    int64_t *ints = (int64_t *)b[2].view.buf;
    double *floats = (double *)b[3].view.buf;
    uint8_t *agreed = (uint8_t *)b[4].view.buf;
    for (int c = 0; c < 9; c++)
        if (read_ints(cols[c], ints + c * n, n, names[c]) < 0) goto done;
    for (int c = 0; c < 3; c++)
        if (read_column(cols[9 + c], floats + c * n, n, names[9 + c], 'f') < 0) goto done;
    if (read_column(cols[12], agreed, n, "agreed", 'b') < 0) goto done;
    int64_t *parent = ints, *kind = ints + n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parent[i] >= i || parent[i] < -1) {
            PyErr_SetString(PyExc_ValueError,
                            "CandidateSet: every parent must precede its children (parent index < own index)");
            goto done;
        }
        if (kind[i] < 0 || kind[i] > KIND_NGRAM) {
            PyErr_SetString(PyExc_ValueError, "CandidateSet: kind must be 0 (pick), 1 (sibling) or 2 (n-gram)");
            goto done;
        }
    }
    /* precision.for_nodes: each node's class is its own proposal's, or the contradicting one's */
    const double *hits = (const double *)b[0].view.buf, *trials = (const double *)b[1].view.buf;
    double bh[3][TABLE_MAX], bt[3][TABLE_MAX];
    for (int k = 0; k < 3; k++) {
        for (int64_t j = 0; j < n_bins; j++) bh[k][j] = bt[k][j] = 0.0;
        for (Py_ssize_t e = 0; e < classes; e++) {
            bh[k][bin_of[e]] += hits[k * classes + e];
            bt[k][bin_of[e]] += trials[k * classes + e];
        }
    }
    const int64_t *ng_kind = ints + 4 * n, *ng_ev = ints + 5 * n, *co_ev = ints + 7 * n, *co_kind = ints + 8 * n;
    double *ng_prec = floats + 3 * n;
    const double w = class_prior_weight;
    for (Py_ssize_t i = 0; i < n; i++) {
        int contra = kind[i] != KIND_NGRAM && !agreed[i] && co_ev[i] >= 0;
        int64_t k = contra ? co_kind[i] : ng_kind[i];
        int64_t e = clip(contra ? co_ev[i] : ng_ev[i], 0, class_cap);
        if (k == NG_COPY || k == NG_FOLLOWER) {
            int64_t bin = bin_of[e];
            double prior = (bh[k][bin] + w * overall) / (bt[k][bin] + w);
            ng_prec[i] = (hits[k * classes + e] + w * prior) / (trials[k * classes + e] + w);
        } else {
            ng_prec[i] = overall;
        }
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(b, 5);
    return ret;
}

/* ------------------------------------------------------------------ eq6
 * eq6(ints, floats, agreed, n, x_ctx, p_src, w, b_req, offset, idx, val, per_node, bucket) -> None
 *
 * ints / floats / agreed: columns()'s layout. Writes the design (idx, val: n x 7; per_node rows:
 * fixed, head_base, q_fit, q_head; bucket) as acceptance._design, _fitted and _head compute it.
 */
static PyObject *eq6(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_ints, *o_floats, *o_agreed, *o_w, *o_idx, *o_val, *o_per, *o_bucket;
    Py_ssize_t n;
    double x_ctx, p_src, b_req, offset;
    if (!PyArg_ParseTuple(args, "OOOnddOddOOOO", &o_ints, &o_floats, &o_agreed, &n, &x_ctx, &p_src, &o_w, &b_req,
                          &offset, &o_idx, &o_val, &o_per, &o_bucket))
        return NULL;
    if (check_configured() < 0) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "eq6: n < 0");
        return NULL;
    }
    Buf b[8];
    memset(b, 0, sizeof b);
    PyObject *ret = NULL;
    double *s = NULL, *gmax = NULL, *gden = NULL;
    if (get_buf(o_ints, &b[0], 9 * n * 8, 0, "ints") < 0 || get_buf(o_floats, &b[1], 4 * n * 8, 0, "floats") < 0 ||
        get_buf(o_agreed, &b[2], n, 0, "agreed") < 0 || get_buf(o_w, &b[3], n_coef * 8, 0, "w") < 0 ||
        get_buf(o_idx, &b[4], SLOTS * n * 8, 1, "idx") < 0 || get_buf(o_val, &b[5], SLOTS * n * 8, 1, "val") < 0 ||
        get_buf(o_per, &b[6], 4 * n * 8, 1, "per_node") < 0 || get_buf(o_bucket, &b[7], n * 8, 1, "bucket") < 0)
        goto done;
    const int64_t *ints = (const int64_t *)b[0].view.buf;
    const int64_t *parent = ints, *kind = ints + n, *depth = ints + 3 * n, *ng_kind = ints + 4 * n,
                  *ng_ev = ints + 5 * n, *ng_above = ints + 6 * n, *co_ev = ints + 7 * n, *co_kind = ints + 8 * n;
    const double *floats = (const double *)b[1].view.buf;
    const double *h = floats, *sigma = floats + n, *r = floats + 2 * n, *ng_prec = floats + 3 * n;
    const uint8_t *agreed_c = (const uint8_t *)b[2].view.buf;
    const double *w = (const double *)b[3].view.buf;
    int64_t *idx = (int64_t *)b[4].view.buf, *bucket = (int64_t *)b[7].view.buf;
    double *val = (double *)b[5].view.buf, *per = (double *)b[6].view.buf;
    double *fixed = per, *head_base = per + n, *q_fit = per + 2 * n, *q_head = per + 3 * n;
    const double p_one = p_src == p_src ? p_src : 0.5;
    s = malloc((n + 1) * sizeof(double) * 3);
    if (!s) {
        PyErr_NoMemory();
        goto done;
    }
    gmax = s + n + 1;
    gden = gmax + n + 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t k = kind[i];
        if (k < 0 || k > KIND_NGRAM || parent[i] < -1 || parent[i] >= i) {
            PyErr_SetString(PyExc_ValueError, "eq6: a malformed candidate set (kind or parent)");
            goto done;
        }
        const int pick = k == KIND_PICK, sib = k == KIND_SIBLING, ng = k == KIND_NGRAM, drafter = pick || sib;
        const double hf = h[i] == h[i] ? h[i] : 0.5, sf = sigma[i] == sigma[i] ? sigma[i] : 0.5;
        const double pf = ng_prec[i] == ng_prec[i] ? ng_prec[i] : p_one, rf = r[i] == r[i] ? r[i] : 1.0;
        const double lh = logit(hf), ls = logit(sf), lp = logit(pf);
        const double lr = log(fmin(fmax(rf, 1e-6), 1.0));
        const double lp_pos = fmax(lp, 0.0);
        const int64_t kk = clip(ng_kind[i] - 1, 0, 1);
        const int64_t bk = (kk * n_ev + ev_bin[clip(ng_ev[i], 0, ev_cap)]) * n_above + ab_bin[clip(ng_above[i], 0, ab_cap)];
        bucket[i] = bk;
        int64_t *ix = idx + i * SLOTS;
        double *v = val + i * SLOTS;
        for (int j = 0; j < SLOTS; j++) ix[j] = kind_idx[k][j];
        if (ng) ix[0] += bk;
        v[0] = 1.0;
        v[1] = drafter ? lh : 0.0;
        v[2] = drafter ? ls : 0.0;
        v[3] = sib ? lr : 0.0;
        v[4] = x_ctx;
        const int64_t d = clip(depth[i], 1, depth_max);
        const int deep = d >= 2;
        ix[5] = deep ? depth0 + d - 2 : 0;
        v[5] = (drafter && deep) ? 1.0 : 0.0;
        const int agreed = drafter && agreed_c[i];
        const int contra = drafter && !agreed_c[i] && co_ev[i] >= 0;
        const int64_t ps = sib;
        const int64_t ck = clip(co_kind[i] - 1, 0, 1);
        ix[6] = agreed ? ag0 + bk * 2 + ps : (contra ? co0 + (ck * n_ev + ev_bin[clip(co_ev[i], 0, ev_cap)]) * 2 + ps : 0);
        v[6] = (agreed || contra) ? 1.0 : 0.0;
        for (int j = 0; j < SLOTS; j++)
            if (ix[j] < 0 || ix[j] >= n_coef) {
                PyErr_SetString(PyExc_ValueError, "eq6: a coefficient index outside the layout");
                goto done;
            }
        fixed[i] = ((ng ? lp : 0.0) + (agreed ? lp_pos : 0.0)) - (contra ? lp_pos : 0.0);
        const double h_pick = h[i] == h[i] ? h[i] : sf;
        head_base[i] = pick ? h_pick : (sib ? rf * (1.0 - sf) : pf);
        /* _scores: (w[idx] * val).sum(axis=1) + fixed + b_req; numpy's sum of 7 starts from the
           first product and adds the rest's running sum */
        double rest = 0.0;
        for (int j = 1; j < SLOTS; j++) rest += w[ix[j]] * v[j];
        s[i] = ((w[ix[0]] * v[0] + rest) + fixed[i]) + b_req;
        /* _head: sigmoid(logit(head_base) + offset) */
        q_head[i] = 0.5 * (1.0 + tanh(0.5 * (logit(head_base[i]) + offset)));
    }
    /* _softmax_with_none: groups are parent + 1 (0: the anchor), "none" scores 0 */
    for (Py_ssize_t g = 0; g <= n; g++) gmax[g] = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t g = parent[i] + 1;
        if (s[i] > gmax[g]) gmax[g] = s[i];
    }
    for (Py_ssize_t g = 0; g <= n; g++) gden[g] = exp(-gmax[g]);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t g = parent[i] + 1;
        q_fit[i] = exp(s[i] - gmax[g]);
        gden[g] += q_fit[i];
    }
    for (Py_ssize_t i = 0; i < n; i++) q_fit[i] /= gden[parent[i] + 1];
    ret = Py_None;
    Py_INCREF(ret);
done:
    free(s);
    release(b, 8);
    return ret;
}

/* ------------------------------------------------------------------ tree_values
 * tree_values(q, ints, agreed, n, out, order, is_ng) -> None
 *
 * out (float64): Q (n), Q_commit (n), s_d (n + 2), s_n (n + 2); order (n int64), is_ng (n bytes).
 */
typedef struct {
    double v;
    int64_t i;
} Ranked;

static int by_value_then_index(const void *a, const void *b) {
    const Ranked *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

static PyObject *tree_values(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_q, *o_ints, *o_agreed, *o_out, *o_order, *o_isng;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOOnOOO", &o_q, &o_ints, &o_agreed, &n, &o_out, &o_order, &o_isng)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "tree_values: n < 0");
        return NULL;
    }
    Buf b[6];
    memset(b, 0, sizeof b);
    PyObject *ret = NULL;
    int64_t *top = NULL;
    Ranked *rk = NULL;
    if (get_buf(o_q, &b[0], n * 8, 0, "q") < 0 || get_buf(o_ints, &b[1], 2 * n * 8, 0, "ints") < 0 ||
        get_buf(o_agreed, &b[2], n, 0, "agreed") < 0 || get_buf(o_out, &b[3], (4 * n + 4) * 8, 1, "out") < 0 ||
        get_buf(o_order, &b[4], n * 8, 1, "order") < 0 || get_buf(o_isng, &b[5], n, 1, "is_ng") < 0)
        goto done;
    const double *q = (const double *)b[0].view.buf;
    const int64_t *parent = (const int64_t *)b[1].view.buf, *kind = parent + n;
    const uint8_t *agreed = (const uint8_t *)b[2].view.buf;
    double *Q = (double *)b[3].view.buf, *Qc = Q + n, *sd = Qc + n, *sn = sd + n + 2;
    int64_t *order = (int64_t *)b[4].view.buf;
    uint8_t *is_ng = (uint8_t *)b[5].view.buf;
    top = malloc((n + 1) * sizeof(int64_t) + n * sizeof(uint8_t) + 1);
    rk = malloc((n + 1) * sizeof(Ranked));
    if (!top || !rk) {
        PyErr_NoMemory();
        goto done;
    }
    uint8_t *spine = (uint8_t *)(top + n + 1);
    /* path_products */
    for (Py_ssize_t j = 0; j < n; j++) {
        const int64_t p = parent[j];
        if (p < -1 || p >= j) {
            PyErr_SetString(PyExc_ValueError, "tree_values: every parent must precede its children");
            goto done;
        }
        Q[j] = p < 0 ? q[j] : Q[p] * q[j];
    }
    /* committable: each parent's top child (highest Q, the lower index on ties), the spine */
    for (Py_ssize_t g = 0; g <= n; g++) top[g] = -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        const int64_t g = parent[j] + 1;
        if (top[g] < 0 || Q[j] > Q[top[g]]) top[g] = j;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        const int64_t p = parent[j];
        spine[j] = top[p + 1] == j && (p < 0 || spine[p]);
        Qc[j] = spine[j] ? Q[j] : 0.0;
    }
    /* best_first_order: decreasing Q_commit, ties toward the lower index */
    for (Py_ssize_t j = 0; j < n; j++) {
        rk[j].v = Qc[j];
        rk[j].i = j;
    }
    qsort(rk, (size_t)n, sizeof(Ranked), by_value_then_index);
    /* expected_accepted (Eq. 1), split by source */
    sd[0] = sd[1] = sn[0] = sn[1] = 0.0;
    for (Py_ssize_t j = 0; j < n; j++) is_ng[j] = kind[j] == KIND_NGRAM && !agreed[j];
    double acc_d = 0.0, acc_n = 0.0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const int64_t j = rk[k].i;
        order[k] = j;
        if (is_ng[j])
            acc_n += Qc[j];
        else
            acc_d += Qc[j];
        sd[k + 2] = acc_d;
        sn[k + 2] = acc_n;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    free(top);
    free(rk);
    release(b, 6);
    return ret;
}

/* ------------------------------------------------------------------ observe_classes */

/* learn/precision.py SourcePrecision.observe_many's class counts: for each observation j, in order,
 * every cell of both tables decays (x *= decay), then cell (kind[j], evidence[j]) counts one trial
 * and hit[j] hits: numpy's in-place operations, the same roundings, one call for a round's tokens. */
static PyObject *observe_classes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_hits, *o_trials, *o_kind, *o_ev, *o_hit;
    double decay;
    Py_ssize_t cols;
    if (!PyArg_ParseTuple(args, "OOOOOdn", &o_hits, &o_trials, &o_kind, &o_ev, &o_hit, &decay, &cols)) return NULL;
    Py_ssize_t m = PySequence_Size(o_kind);
    if (m < 0) return NULL;
    Buf b[2];
    memset(b, 0, sizeof b);
    PyObject *ret = NULL;
    int64_t *obs = malloc((3 * m + 1) * sizeof(int64_t));
    if (!obs) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_ints(o_kind, obs, m, "kind") < 0 || read_ints(o_ev, obs + m, m, "evidence") < 0 ||
        read_ints(o_hit, obs + 2 * m, m, "hit") < 0)
        goto done;
    if (get_buf(o_hits, &b[0], 0, 1, "class_hits") < 0 || get_buf(o_trials, &b[1], 0, 1, "class_trials") < 0) goto done;
    const Py_ssize_t cells = b[0].view.len / (Py_ssize_t)sizeof(double);
    if (b[1].view.len != b[0].view.len || cols < 1 || cells % cols != 0) {
        PyErr_SetString(PyExc_ValueError, "observe_classes: the tables differ in size or do not hold whole rows");
        goto done;
    }
    double *hits = (double *)b[0].view.buf, *trials = (double *)b[1].view.buf;
    for (Py_ssize_t j = 0; j < m; j++) {
        const int64_t k = obs[j], e = obs[m + j];
        if (k < 0 || e < 0 || e >= cols || k * cols + e >= cells) {
            PyErr_Format(PyExc_ValueError, "observe_classes: class (%lld, %lld) is outside the tables", (long long)k,
                         (long long)e);
            goto done;
        }
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        for (Py_ssize_t i = 0; i < cells; i++) {
            trials[i] *= decay;
            hits[i] *= decay;
        }
        const Py_ssize_t at = (Py_ssize_t)(obs[j] * cols + obs[m + j]);
        trials[at] += 1.0;
        hits[at] += (double)obs[2 * m + j];
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    free(obs);
    release(b, 2);
    return ret;
}

/* ------------------------------------------------------------------ top_k */

/* Whether row[a] comes after row[b] in the canonical order (logit descending, then id ascending). */
static inline int after(const float *row, int64_t a, int64_t b) {
    return row[a] < row[b] || (row[a] == row[b] && a > b);
}

static void sift_down(const float *row, int64_t *heap, Py_ssize_t k, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, last = i;
        if (l < k && after(row, heap[l], heap[last])) last = l;
        if (r < k && after(row, heap[r], heap[last])) last = r;
        if (last == i) return;
        const int64_t t = heap[i];
        heap[i] = heap[last];
        heap[last] = t;
        i = last;
    }
}

static const float *sort_row; /* qsort's comparator reads the row here (one call at a time: the GIL) */

static int canonical(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return after(sort_row, x, y) ? 1 : (after(sort_row, y, x) ? -1 : 0);
}

/* engine/sampling.py processed_distribution's top-k: the first k tokens of a row of float32 logits
 * in the canonical order, into out (int64) in that order; one pass keeping the k first seen so far
 * in a heap whose root is the last of them. Returns False, out unread, where the row holds a NaN
 * (it has no canonical order; the numpy code takes it). */
static PyObject *top_k(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_row, *o_out;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OnO", &o_row, &k, &o_out)) return NULL;
    Buf b[2];
    memset(b, 0, sizeof b);
    PyObject *ret = NULL;
    if (get_buf(o_row, &b[0], 0, 0, "row") < 0) goto done;
    const Py_ssize_t n = b[0].view.len / (Py_ssize_t)sizeof(float);
    if (k < 1 || k > n) {
        PyErr_Format(PyExc_ValueError, "top_k: k is %zd for a row of %zd", k, n);
        goto done;
    }
    if (get_buf(o_out, &b[1], k * (Py_ssize_t)sizeof(int64_t), 1, "out") < 0) goto done;
    const float *row = (const float *)b[0].view.buf;
    int64_t *heap = (int64_t *)b[1].view.buf;
    int nan = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        nan |= row[i] != row[i];
        heap[i] = i;
    }
    if (!nan) {
        for (Py_ssize_t i = k / 2; i-- > 0;) sift_down(row, heap, k, i);
        for (Py_ssize_t i = k; i < n; i++) {
            const float x = row[i];
            if (x > row[heap[0]]) { /* a later id at an equal logit comes after every kept one */
                heap[0] = i;
                sift_down(row, heap, k, 0);
            } else if (x != x) {
                nan = 1;
                break;
            }
        }
    }
    if (!nan) {
        sort_row = row;
        qsort(heap, (size_t)k, sizeof(int64_t), canonical);
    }
    ret = nan ? Py_False : Py_True;
    Py_INCREF(ret);
done:
    release(b, 2);
    return ret;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "Set the coefficient layout and the bin tables."},
    {"columns", columns, METH_VARARGS, "A round's candidate columns and their class precision."},
    {"eq6", eq6, METH_VARARGS, "The design and both estimates of Eq. (6)."},
    {"tree_values", tree_values, METH_VARARGS, "Q, the committable Q, the best-first order and S(n)."},
    {"observe_classes", observe_classes, METH_VARARGS, "The n-gram class counts' decay and counts, per token."},
    {"top_k", top_k, METH_VARARGS, "A sampled row's first k tokens in the canonical order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pricing", "AdaSpark's round pricing in C.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__pricing(void) { return PyModule_Create(&module); }
