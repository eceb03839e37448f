/* CUDA graphs with conditional (IF) nodes on the CPU emulator (docs/cuda_graphs.md).
 *
 * #included at the end of driver.c (one library, the driver's own streams). Exactly the
 * entry points the gated BE path of the dispatcher (av_infer/_cy/cuda_dispatch.pyx) calls,
 * with CUDA 12.4+'s prototypes, structure layouts and enum values:
 *   cuGraphCreate, cuGraphDestroy, cuGraphConditionalHandleCreate, cuGraphAddNode
 *   (CU_GRAPH_NODE_TYPE_KERNEL and CU_GRAPH_NODE_TYPE_CONDITIONAL with
 *   CU_GRAPH_COND_TYPE_IF, size 1), cuGraphInstantiateWithFlags, cuGraphExecDestroy,
 *   cuGraphExecKernelNodeSetParams(_v2), cuGraphLaunch.
 * Device code sets a conditional with cudaGraphSetConditional (prelude.h): a handle here is
 * the address of the handle's 32-bit value word.
 *
 * Semantics (a sequential executor):
 * - A node's kernel parameters are copied at cuGraphAddNode (values, by the function's
 *   parameter sizes, as cuLaunchKernel copies them); cuGraphInstantiateWithFlags copies the
 *   whole graph (bodies included) into the executable graph; cuGraphExecKernelNodeSetParams
 *   changes the executable's copy of the node (found through the node it was made from,
 *   also inside conditional bodies) and affects later launches only.
 * - cuGraphLaunch snapshots the executable graph's parameters and enqueues ONE operation on
 *   the stream (in stream order with kernels, events, flag writes). It runs the nodes in
 *   the order they were added (every node's dependencies are added before it, so this is a
 *   topological order; nodes never run concurrently). At the start of each launch every
 *   handle created with CU_GRAPH_COND_ASSIGN_DEFAULT takes its default value. A conditional
 *   IF node runs its body when the handle's value is nonzero.
 * - Launches of one executable graph never overlap (a mutex per executable graph; CUDA
 *   orders them, the emulator only excludes them).
 * - A failing kernel node fails the stream like a failing cuLaunchKernel (the rest of the
 *   graph is skipped; later events report CUDA_ERROR_LAUNCH_FAILED).
 * Test hooks: avi_emu_graph_refuse(1) makes cuGraphConditionalHandleCreate answer
 * CUDA_ERROR_NOT_SUPPORTED (a driver without conditional nodes), avi_emu_graph_refuse(2)
 * makes cuGraphExecKernelNodeSetParams refuse nodes inside a conditional body (801); avi_emu_graph_fail_after(n)
 * makes the n-th graph kernel node executed from now fail (returns 719, does not run);
 * avi_emu_graph_runs(out[2]) counts graph launches and kernel nodes run.
 *
 * Stream capture (RT as one graph, docs/cuda_graphs.md): cuStreamBeginCapture_v2 (any
 * mode; the emulator keeps no thread-local capture rules, as CU_STREAM_CAPTURE_MODE_RELAXED),
 * cuStreamEndCapture, cuStreamIsCapturing. While a stream captures, a kernel launch on it
 * becomes a kernel node (its parameter values copied as cuLaunchKernel copies them) and a
 * vendor call (vendor_emu.c) a host node that runs the same work at every launch of the
 * graph; the nodes run in capture order. Any other operation on the capturing stream (event
 * record or wait, flag write, memset, copy, a graph launch) and cuStreamSynchronize
 * invalidate the capture: the call fails and cuStreamEndCapture answers
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901) with no graph. The captured graph is an
 * ordinary graph: cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphDestroy. Test hooks
 * (avi_emu_graph_refuse): 3 cuStreamBeginCapture_v2 answers 801, 4 cuStreamEndCapture
 * answers 901 (as if the capture had been invalidated), 5 cuGraphInstantiateWithFlags
 * refuses captured graphs (801), 6 cuGraphLaunch refuses executable graphs made from a
 * capture (801; nothing is enqueued).
 *
 * Capture into an existing graph (vendor ops inside gated BE graphs, docs/cuda_graphs.md,
 * "Vendor ops inside gated graphs"): cuStreamBeginCaptureToGraph(stream, graph, deps,
 * depData, ndeps, mode) with CUDA 13.0's prototype; the graph may be a conditional node's
 * body. The captured operations are appended to that graph (after the given dependencies,
 * which must already be in it; edge data must be NULL); cuStreamEndCapture then returns
 * the same graph (the caller's: it is never freed here, also not when the capture was
 * invalidated: then 901 and *ph = NULL, the nodes captured so far stay in the graph).
 * Nodes made this way are marked, and a graph holding one anywhere (bodies included) is a
 * "body-captured" graph to the hooks. Test hooks (avi_emu_graph_refuse): 7
 * cuStreamBeginCaptureToGraph answers 801, 8 cuGraphInstantiateWithFlags refuses a graph
 * holding body-captured nodes (801); avi_emu_capture_refuse_nth(n): only the n-th
 * cuStreamBeginCaptureToGraph from now answers 801 (one op refused, the others not).
 * Built with -DAVI_EMU_NO_CAPTURE_TO_GRAPH the library does not export
 * cuStreamBeginCaptureToGraph at all (a driver older than CUDA 12.3).
 */

typedef unsigned long long CUgraphConditionalHandle;
typedef struct emu_graph* CUgraph;
typedef struct emu_gnode* CUgraphNode;
typedef struct emu_gexec* CUgraphExec;

enum { CU_GRAPH_NODE_TYPE_KERNEL = 0, CU_GRAPH_NODE_TYPE_CONDITIONAL = 13 };
/* a captured vendor call (emulator only: on a GPU the library's kernels are kernel nodes) */
#define EMU_NODE_HOST 1000
enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
       CU_STREAM_CAPTURE_MODE_RELAXED = 2 };
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
       CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2 };
enum { CU_GRAPH_COND_TYPE_IF = 0, CU_GRAPH_COND_TYPE_WHILE = 1, CU_GRAPH_COND_TYPE_SWITCH = 2 };
#define CU_GRAPH_COND_ASSIGN_DEFAULT 0x1

typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void** kernelParams;
    void** extra;
    void* kern; /* CUkernel */
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2; /* = _v3: the same fields */

typedef struct {
    CUgraphConditionalHandle handle;
    int type; /* CUgraphConditionalNodeType */
    unsigned int size;
    CUgraph* phGraph_out;
    CUcontext ctx;
} CUDA_CONDITIONAL_NODE_PARAMS;

typedef struct {
    int type; /* CUgraphNodeType */
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v2 kernel;
        CUDA_CONDITIONAL_NODE_PARAMS conditional;
    } u;
    long long reserved2;
} CUgraphNodeParams;

_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v2) == 72, "CUDA_KERNEL_NODE_PARAMS_v2 layout");
_Static_assert(sizeof(CUDA_CONDITIONAL_NODE_PARAMS) == 32, "CUDA_CONDITIONAL_NODE_PARAMS layout");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams layout");
_Static_assert(offsetof(CUgraphNodeParams, u) == 16, "CUgraphNodeParams union offset");

#define MAGIC_GRAPH 0x47525048U /* 'GRPH' */
#define MAGIC_GNODE 0x474e4f44U /* 'GNOD' */
#define MAGIC_GEXEC 0x47455845U /* 'GEXE' */

struct emu_cond {
    _Atomic uint32_t value; /* first: the handle is this word's address */
    unsigned dflt;
    unsigned flags;
    struct emu_cond* next;
};

/* a captured host operation, shared by the copies of its node (instantiation, launches) */
struct emu_hostnode {
    atomic_int refs;
    emu_host_fn fn;
    void* data;
};

static void hostnode_unref(struct emu_hostnode* h) {
    if (h && atomic_fetch_sub(&h->refs, 1) == 1) {
        h->fn(h->data, 0); /* frees data */
        free(h);
    }
}

struct emu_gnode {
    uint32_t magic;
    int type;
    int in_body;              /* added to a conditional's body graph */
    struct emu_gnode* next;
    struct emu_gnode* orig;   /* in an executable graph: the node it was copied from */
    /* kernel */
    struct emu_function* f;
    unsigned g[3], b[3], smem;
    char* vals;               /* the parameter values, 64-byte aligned copies */
    /* conditional */
    struct emu_cond* cond;
    struct emu_graph* body;
    /* host (EMU_NODE_HOST) */
    struct emu_hostnode* host;
    int body_captured;        /* made by cuStreamBeginCaptureToGraph */
};

struct emu_graph {
    uint32_t magic;
    struct emu_gnode* head;
    struct emu_gnode* tail;
    struct emu_cond* conds;   /* handles created on this graph (owned by the root) */
    int is_body;
    int captured;             /* made by stream capture */
    int instantiated;
    struct emu_gexec* exec;   /* its executable graph (the handles outlive a destroyed graph) */
};

struct emu_gexec {
    uint32_t magic;
    struct emu_graph* g;      /* the copy */
    struct emu_graph* src;    /* NULL once destroyed (then conds is the executable's) */
    struct emu_cond* conds;   /* the handles, taken over when the source graph is destroyed */
    int captured;             /* instantiated from a captured graph */
    pthread_mutex_t run_mu;   /* held while a launch runs: launches never overlap */
    pthread_mutex_t param_mu; /* the executable's parameters (set / snapshot) */
};

static atomic_int g_graph_refuse;
static atomic_int g_graph_fail_after;
static atomic_int g_capture_refuse_nth;
static _Atomic unsigned long long g_graph_launches, g_graph_kernels;

EXPORT void avi_emu_graph_refuse(int on) { atomic_store(&g_graph_refuse, on); }
EXPORT void avi_emu_graph_fail_after(int n) { atomic_store(&g_graph_fail_after, n); }
EXPORT void avi_emu_capture_refuse_nth(int n) { atomic_store(&g_capture_refuse_nth, n); }
EXPORT void avi_emu_graph_runs(unsigned long long out[2]) {
    out[0] = atomic_load(&g_graph_launches);
    out[1] = atomic_load(&g_graph_kernels);
}

static void gnode_free(struct emu_gnode* n);

static void graph_free(struct emu_graph* g, int free_conds) {
    if (!g) return;
    struct emu_gnode* n = g->head;
    while (n) {
        struct emu_gnode* nx = n->next;
        gnode_free(n);
        n = nx;
    }
    if (free_conds) {
        struct emu_cond* c = g->conds;
        while (c) {
            struct emu_cond* nx = c->next;
            free(c);
            c = nx;
        }
    }
    g->magic = 0;
    free(g);
}

static void gnode_free(struct emu_gnode* n) {
    if (n->f) module_unref(n->f->mod);
    hostnode_unref(n->host);
    free(n->vals);
    graph_free(n->body, 0);
    n->magic = 0;
    free(n);
}

static struct emu_graph* graph_new(int is_body) {
    struct emu_graph* g = calloc(1, sizeof *g);
    if (g) {
        g->magic = MAGIC_GRAPH;
        g->is_body = is_body;
    }
    return g;
}

static void graph_append(struct emu_graph* g, struct emu_gnode* n) {
    if (g->tail)
        g->tail->next = n;
    else
        g->head = n;
    g->tail = n;
}

EXPORT CUresult cuGraphCreate(CUgraph* ph, unsigned int flags) {
    if (!ph || flags) return CUDA_ERROR_INVALID_VALUE;
    *ph = graph_new(0);
    return *ph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
    if (!g || g->magic != MAGIC_GRAPH || g->is_body) return CUDA_ERROR_INVALID_VALUE;
    if (g->instantiated && g->exec) { /* the executable graph keeps the handles */
        g->exec->conds = g->conds;
        g->exec->src = NULL;
        g->conds = NULL;
    }
    graph_free(g, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph g,
                                               CUcontext ctx, unsigned int defaultLaunchValue,
                                               unsigned int flags) {
    (void)ctx;
    if (!out || !g || g->magic != MAGIC_GRAPH || (flags & ~(unsigned)CU_GRAPH_COND_ASSIGN_DEFAULT))
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(&g_graph_refuse) == 1) {
        set_error("cuGraphConditionalHandleCreate: refused (avi_emu_graph_refuse test hook)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct emu_cond* c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    atomic_init(&c->value, defaultLaunchValue);
    c->dflt = defaultLaunchValue;
    c->flags = flags;
    c->next = g->conds;
    g->conds = c;
    *out = (CUgraphConditionalHandle)(uintptr_t)&c->value;
    return CUDA_SUCCESS;
}

/* Copy a kernel's parameter values (by its parameter sizes) into n->vals. */
static CUresult set_kernel(struct emu_gnode* n, const CUDA_KERNEL_NODE_PARAMS_v2* p) {
    struct emu_function* f = p->func;
    if (!func_ok(f)) return CUDA_ERROR_INVALID_HANDLE;
    if (p->extra) return CUDA_ERROR_NOT_SUPPORTED;
    if (f->nparams < 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (!p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY ||
        !p->blockDimZ)
        return CUDA_ERROR_INVALID_VALUE;
    if ((uint64_t)p->blockDimX * p->blockDimY * p->blockDimZ > (uint64_t)EMU_MAX_THREADS)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->sharedMemBytes > (unsigned)atomic_load(&f->max_dyn_smem)) return CUDA_ERROR_INVALID_VALUE;
    if (f->nparams > 0 && !p->kernelParams) return CUDA_ERROR_INVALID_VALUE;
    char* vals = NULL;
    if (f->pbytes) {
        vals = aligned_alloc(EMU_PARAM_ALIGN, round_up(f->pbytes, EMU_PARAM_ALIGN));
        if (!vals) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t off = 0;
    for (int i = 0; i < f->nparams; ++i) {
        if (!p->kernelParams[i] && f->sizes[i]) {
            free(vals);
            return CUDA_ERROR_INVALID_VALUE;
        }
        memcpy(vals + off, p->kernelParams[i], f->sizes[i]);
        off += round_up(f->sizes[i], EMU_PARAM_ALIGN);
    }
    module_ref(f->mod);
    if (n->f) module_unref(n->f->mod);
    free(n->vals);
    n->f = f;
    n->vals = vals;
    n->g[0] = p->gridDimX, n->g[1] = p->gridDimY, n->g[2] = p->gridDimZ;
    n->b[0] = p->blockDimX, n->b[1] = p->blockDimY, n->b[2] = p->blockDimZ;
    n->smem = p->sharedMemBytes;
    return CUDA_SUCCESS;
}

static int in_graph(struct emu_graph* g, struct emu_gnode* x) {
    for (struct emu_gnode* n = g->head; n; n = n->next) {
        if (n == x) return 1;
        if (n->body && in_graph(n->body, x)) return 1;
    }
    return 0;
}

EXPORT CUresult cuGraphAddNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps, size_t ndeps,
                               CUgraphNodeParams* p) {
    if (!ph || !g || g->magic != MAGIC_GRAPH || !p || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    if (g->instantiated) return CUDA_ERROR_NOT_PERMITTED; /* conditional graphs: one instantiation */
    for (size_t i = 0; i < ndeps; ++i) /* dependencies: nodes already in this graph */
        if (!deps[i] || deps[i]->magic != MAGIC_GNODE || !in_graph(g, deps[i]))
            return CUDA_ERROR_INVALID_VALUE;
    struct emu_gnode* n = calloc(1, sizeof *n);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->magic = MAGIC_GNODE;
    n->type = p->type;
    n->in_body = g->is_body;
    CUresult rc = CUDA_SUCCESS;
    if (p->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        rc = set_kernel(n, &p->u.kernel);
    } else if (p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
        const CUDA_CONDITIONAL_NODE_PARAMS* c = &p->u.conditional;
        if (c->type != CU_GRAPH_COND_TYPE_IF || c->size != 1 || !c->handle) {
            set_error("cuGraphAddNode: the emulator has IF conditionals with one body only");
            rc = c->type == CU_GRAPH_COND_TYPE_IF ? CUDA_ERROR_INVALID_VALUE
                                                  : CUDA_ERROR_NOT_SUPPORTED;
        } else {
            n->cond = (struct emu_cond*)(uintptr_t)c->handle;
            n->body = graph_new(1);
            if (!n->body) rc = CUDA_ERROR_OUT_OF_MEMORY;
            else p->u.conditional.phGraph_out = &n->body;
        }
    } else {
        set_error("cuGraphAddNode: node type %d is not emulated", p->type);
        rc = CUDA_ERROR_NOT_SUPPORTED;
    }
    if (rc != CUDA_SUCCESS) {
        free(n->vals);
        if (n->f) module_unref(n->f->mod);
        free(n->body);
        free(n);
        return rc;
    }
    graph_append(g, n);
    *ph = n;
    return CUDA_SUCCESS;
}

/* Deep copy of g's nodes (kernel values, bodies); conds are shared with the source. */
static struct emu_graph* graph_copy(struct emu_graph* g, int keep_orig) {
    struct emu_graph* c = graph_new(g->is_body);
    if (!c) return NULL;
    for (struct emu_gnode* n = g->head; n; n = n->next) {
        struct emu_gnode* m = calloc(1, sizeof *m);
        if (!m) goto fail;
        m->magic = MAGIC_GNODE;
        m->type = n->type;
        m->in_body = n->in_body;
        m->orig = keep_orig ? (n->orig ? n->orig : n) : NULL;
        m->f = n->f;
        memcpy(m->g, n->g, sizeof m->g);
        memcpy(m->b, n->b, sizeof m->b);
        m->smem = n->smem;
        m->cond = n->cond;
        m->host = n->host;
        m->body_captured = n->body_captured;
        if (m->host) atomic_fetch_add(&m->host->refs, 1);
        graph_append(c, m);
        if (n->f) {
            module_ref(n->f->mod);
            if (n->f->pbytes) {
                m->vals = aligned_alloc(EMU_PARAM_ALIGN, round_up(n->f->pbytes, EMU_PARAM_ALIGN));
                if (!m->vals) goto fail;
                memcpy(m->vals, n->vals, n->f->pbytes);
            }
        }
        if (n->body && !(m->body = graph_copy(n->body, keep_orig))) goto fail;
    }
    return c;
fail:
    graph_free(c, 0);
    return NULL;
}

static int has_body_captured(struct emu_graph* g) {
    for (struct emu_gnode* n = g->head; n; n = n->next)
        if (n->body_captured || (n->body && has_body_captured(n->body))) return 1;
    return 0;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* ph, CUgraph g, unsigned long long flags) {
    if (!ph || !g || g->magic != MAGIC_GRAPH || g->is_body || flags) return CUDA_ERROR_INVALID_VALUE;
    if (g->instantiated) return CUDA_ERROR_NOT_PERMITTED;
    if (g->captured && atomic_load(&g_graph_refuse) == 5) {
        set_error("cuGraphInstantiateWithFlags: captured graph refused (avi_emu_graph_refuse(5))");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (atomic_load(&g_graph_refuse) == 8 && has_body_captured(g)) {
        set_error("cuGraphInstantiateWithFlags: graph with nodes captured into a body refused "
                  "(avi_emu_graph_refuse(8))");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct emu_gexec* x = calloc(1, sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    x->g = graph_copy(g, 1);
    if (!x->g) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    x->magic = MAGIC_GEXEC;
    x->src = g;
    x->captured = g->captured;
    pthread_mutex_init(&x->run_mu, NULL);
    pthread_mutex_init(&x->param_mu, NULL);
    g->instantiated = 1;
    g->exec = x;
    *ph = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec x) {
    if (!x || x->magic != MAGIC_GEXEC) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&x->run_mu); /* a launch still running holds it */
    pthread_mutex_unlock(&x->run_mu);
    if (x->src && x->src->magic == MAGIC_GRAPH) {
        x->src->instantiated = 0;
        x->src->exec = NULL;
    }
    struct emu_cond* c = x->conds;
    while (c) {
        struct emu_cond* nx = c->next;
        free(c);
        c = nx;
    }
    graph_free(x->g, 0);
    pthread_mutex_destroy(&x->run_mu);
    pthread_mutex_destroy(&x->param_mu);
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}

static struct emu_gnode* find_copy(struct emu_graph* g, struct emu_gnode* orig) {
    for (struct emu_gnode* n = g->head; n; n = n->next) {
        if (n->orig == orig) return n;
        if (n->body) {
            struct emu_gnode* m = find_copy(n->body, orig);
            if (m) return m;
        }
    }
    return NULL;
}

EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode node,
                                                  const CUDA_KERNEL_NODE_PARAMS_v2* p) {
    if (!x || x->magic != MAGIC_GEXEC || !node || node->magic != MAGIC_GNODE || !p)
        return CUDA_ERROR_INVALID_VALUE;
    struct emu_gnode* m = find_copy(x->g, node);
    if (!m || m->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    if (p->func != m->f) return CUDA_ERROR_INVALID_VALUE; /* CUDA: same context; we: same function */
    if (m->in_body && atomic_load(&g_graph_refuse) == 2) {
        set_error("cuGraphExecKernelNodeSetParams: body node refused (avi_emu_graph_refuse(2))");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&x->param_mu); /* launches snapshot under it */
    CUresult rc = set_kernel(m, p);
    pthread_mutex_unlock(&x->param_mu);
    return rc;
}

EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec x, CUgraphNode node,
                                               const CUDA_KERNEL_NODE_PARAMS_v2* p) {
    return cuGraphExecKernelNodeSetParams_v2(x, node, p);
}

struct glaunch {
    struct emu_gexec* x;
    struct emu_graph* g;      /* the snapshot */
};

static int run_graph(struct emu_graph* g) {
    for (struct emu_gnode* n = g->head; n; n = n->next) {
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
            struct emu_function* f = n->f;
            int left = atomic_load(&g_graph_fail_after);
            if (left > 0 && atomic_fetch_sub(&g_graph_fail_after, 1) == 1) {
                set_error("graph kernel node %s failed (avi_emu_graph_fail_after test hook)",
                          f->name);
                return CUDA_ERROR_LAUNCH_FAILED;
            }
            void* ptrs[64];
            if (f->nparams > 64) return CUDA_ERROR_NOT_SUPPORTED;
            size_t off = 0;
            for (int i = 0; i < f->nparams; ++i) {
                ptrs[i] = n->vals + off;
                off += round_up(f->sizes[i], EMU_PARAM_ALIGN);
            }
            int rc = f->fn(f->nparams ? ptrs : NULL, n->g[0], n->g[1], n->g[2], n->b[0], n->b[1],
                           n->b[2], n->smem);
            atomic_fetch_add(&g_graph_kernels, 1);
            if (rc != 0) {
                set_error("graph kernel node %s returned %d", f->name, rc);
                return rc;
            }
        } else if (n->type == EMU_NODE_HOST) {
            int rc = n->host->fn(n->host->data, 3); /* run, keep the data for later launches */
            atomic_thread_fence(memory_order_seq_cst);
            if (rc != 0) {
                set_error("graph host node (captured vendor call) returned %d", rc);
                return rc;
            }
        } else if (n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
            atomic_thread_fence(memory_order_seq_cst);
            if (atomic_load(&n->cond->value) != 0) {
                int rc = run_graph(n->body);
                if (rc != 0) return rc;
            }
        }
    }
    return 0;
}

static int glaunch_run(void* data, int run) {
    struct glaunch* l = data;
    int rc = 0;
    if (run) {
        pthread_mutex_lock(&l->x->run_mu);
        struct emu_cond* conds = l->x->src ? l->x->src->conds : l->x->conds;
        for (struct emu_cond* c = conds; c; c = c->next)
            if (c->flags & CU_GRAPH_COND_ASSIGN_DEFAULT) atomic_store(&c->value, c->dflt);
        atomic_fetch_add(&g_graph_launches, 1);
        rc = run_graph(l->g);
        pthread_mutex_unlock(&l->x->run_mu);
    }
    graph_free(l->g, 0);
    free(l);
    return rc;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec x, CUstream h) {
    if (!x || x->magic != MAGIC_GEXEC) return CUDA_ERROR_INVALID_VALUE;
    if (x->captured && atomic_load(&g_graph_refuse) == 6) {
        set_error("cuGraphLaunch: captured graph refused (avi_emu_graph_refuse(6))");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct glaunch* l = calloc(1, sizeof *l);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&x->param_mu);
    l->g = graph_copy(x->g, 0); /* parameters as of this call */
    pthread_mutex_unlock(&x->param_mu);
    if (!l->g) {
        free(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    l->x = x;
    CUresult rc = emu_enqueue_host(h, glaunch_run, l);
    if (rc != CUDA_SUCCESS) {
        graph_free(l->g, 0);
        free(l);
    }
    return rc;
}

/* -- stream capture -------------------------------------------------------------------- */
static int capture_op(struct emu_stream* s, struct op* op) {
    if (s->capture_err) return 0; /* already invalidated */
    struct emu_gnode* n = calloc(1, sizeof *n);
    if (!n) {
        s->capture_err = CUDA_ERROR_OUT_OF_MEMORY;
        return 0;
    }
    n->magic = MAGIC_GNODE;
    if (op->kind == OP_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS_v2 p;
        memset(&p, 0, sizeof p);
        p.func = op->u.k.f;
        p.gridDimX = op->u.k.g[0], p.gridDimY = op->u.k.g[1], p.gridDimZ = op->u.k.g[2];
        p.blockDimX = op->u.k.b[0], p.blockDimY = op->u.k.b[1], p.blockDimZ = op->u.k.b[2];
        p.sharedMemBytes = op->u.k.smem;
        p.kernelParams = op->u.k.params;
        CUresult rc = set_kernel(n, &p); /* the values, as cuLaunchKernel copied them */
        if (rc != CUDA_SUCCESS) {
            free(n);
            s->capture_err = rc;
            return 0;
        }
        n->type = CU_GRAPH_NODE_TYPE_KERNEL;
        module_unref(op->u.k.f->mod); /* the launch's reference; the node holds its own */
    } else if (op->kind == OP_HOST && op->u.host.replay) {
        n->host = malloc(sizeof *n->host);
        if (!n->host) {
            free(n);
            s->capture_err = CUDA_ERROR_OUT_OF_MEMORY;
            return 0;
        }
        atomic_init(&n->host->refs, 1);
        n->host->fn = op->u.host.fn;
        n->host->data = op->u.host.data;
        n->type = EMU_NODE_HOST;
    } else {
        free(n);
        s->capture_err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        set_error("stream capture: operation kind %d cannot be captured by the emulator "
                  "(the capture is invalidated)", op->kind);
        return 0;
    }
    n->in_body = s->capture->is_body;
    n->body_captured = s->capture_into;
    graph_append(s->capture, n);
    free(op);
    return 1;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, int mode) {
    if ((uintptr_t)h <= 2) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* legacy stream */
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(&g_graph_refuse) == 3) {
        set_error("cuStreamBeginCapture_v2: refused (avi_emu_graph_refuse(3))");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct emu_graph* g = graph_new(0);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->captured = 1;
    pthread_mutex_lock(&s->mu);
    if (s->capture || s->stop) {
        pthread_mutex_unlock(&s->mu);
        graph_free(g, 1);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    s->capture = g;
    s->capture_err = CUDA_SUCCESS;
    s->capture_into = 0;
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}

#ifndef AVI_EMU_NO_CAPTURE_TO_GRAPH
typedef void CUgraphEdgeData; /* only NULL is accepted here */

EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream h, CUgraph g, const CUgraphNode* deps,
                                            const CUgraphEdgeData* depData, size_t ndeps,
                                            int mode) {
    if ((uintptr_t)h <= 2) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* legacy stream */
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (!g || g->magic != MAGIC_GRAPH || (ndeps && !deps) || depData)
        return CUDA_ERROR_INVALID_VALUE;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (g->instantiated) return CUDA_ERROR_NOT_PERMITTED; /* conditional graphs: one instantiation */
    for (size_t i = 0; i < ndeps; ++i) /* dependencies: nodes already in this graph */
        if (!deps[i] || deps[i]->magic != MAGIC_GNODE || !in_graph(g, deps[i]))
            return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(&g_graph_refuse) == 7) {
        set_error("cuStreamBeginCaptureToGraph: refused (avi_emu_graph_refuse(7))");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int nth = atomic_load(&g_capture_refuse_nth);
    if (nth > 0 && atomic_fetch_sub(&g_capture_refuse_nth, 1) == 1) {
        set_error("cuStreamBeginCaptureToGraph: refused (avi_emu_capture_refuse_nth)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&s->mu);
    if (s->capture || s->stop) {
        pthread_mutex_unlock(&s->mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    s->capture = g;
    s->capture_err = CUDA_SUCCESS;
    s->capture_into = 1;
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}
#endif

EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph* ph) {
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    struct emu_graph* g = s->capture;
    CUresult err = s->capture_err;
    int into = s->capture_into;
    s->capture = NULL;
    s->capture_err = CUDA_SUCCESS;
    s->capture_into = 0;
    pthread_mutex_unlock(&s->mu);
    *ph = NULL;
    if (!g) return CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
    if (err == CUDA_SUCCESS && atomic_load(&g_graph_refuse) == 4) {
        set_error("cuStreamEndCapture: capture invalidated (avi_emu_graph_refuse(4))");
        err = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    if (err != CUDA_SUCCESS) {
        if (!into) graph_free(g, 1); /* capture into a graph: the caller's graph stays */
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *ph = g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream h, int* status) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    *status = !s->capture ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->capture_err ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}
