/* libavi_cuda_emu.so: the driver half of the CPU emulator of the CUDA device
 * (docs/cuda_emu.md). It exports the CUDA driver API entry points that the dispatcher
 * (cython_ext/cuda_dispatch.pyx, load_driver) and CudaDevice (av_infer/devices/cuda.py)
 * resolve, with CUDA's semantics on host memory: a CUdeviceptr is a host address.
 * Built by av_infer/devices/cuda_emu/driver.py (gcc -O2 -std=c11 -shared -fPIC -pthread).
 *
 * Semantics, and where they differ from CUDA
 * ------------------------------------------
 * Context / device: cuInit accepts flags 0 and is not required before other calls. There
 *   is one device (ordinal 0) and one dummy context; cuCtxGetCurrent always returns it
 *   (never NULL), cuCtxSetCurrent accepts any value. Stream priorities: (least, greatest)
 *   = (0, -5); requested priorities are clamped into that range, recorded, not enforced.
 * Modules: cuModuleLoadData takes the bytes of an emulated module (an x86-64 ELF shared
 *   object, docs/cuda_emu.md section 1). Its size is read from the ELF64 header (the end of
 *   the section-header table, or of the program headers/segments if that is further);
 *   it is written to a private file (mkstemps in $TMPDIR, else /tmp, else /dev/shm; name
 *   unique per process), dlopen(RTLD_NOW | RTLD_LOCAL)ed and unlinked at once; it must
 *   export avi_emu_abi_version() == 1. Every load is a separate instance (own statics).
 *   A bad image, a failing dlopen or a wrong ABI version give CUDA_ERROR_INVALID_IMAGE;
 *   avi_emu_driver_last_error() returns the reason (e.g. dlerror()).
 *   cuModuleGetFunction resolves avi_emu_<name> (CUDA_ERROR_NOT_FOUND if absent) and calls
 *   avi_emuparams_<name> (optional; without it launches fail with 801) once for the
 *   parameter sizes; the same name gives
 *   the same CUfunction. cuModuleUnload is reference counted: the module handle holds one
 *   reference and every launch not yet executed holds one, so the shared object is
 *   dlclosed when the last launch of the module has run (CUDA: unloading a module with
 *   pending launches is undefined). CUfunction handles die with the module.
 *   cuFuncGetAttribute returns fixed values: MAX_THREADS_PER_BLOCK (0) 1024,
 *   SHARED_SIZE_BYTES (1) 0, CONST_SIZE_BYTES (2) 0, LOCAL_SIZE_BYTES (3) 0, NUM_REGS (4)
 *   32, PTX_VERSION (5) 80, BINARY_VERSION (6) 80, CACHE_MODE_CA (7) 0,
 *   MAX_DYNAMIC_SHARED_SIZE_BYTES (8) 49152 (or what cuFuncSetAttribute set, <= 232448),
 *   PREFERRED_SHARED_MEMORY_CARVEOUT (9) -1 (or what was set), 10..15 (cluster) 0.
 *   cuOccupancyMaxActiveBlocksPerMultiprocessor: min(32, 2048 / threads) for 1..1024
 *   threads, 0 above 1024; dynamic shared memory is ignored.
 * Launches: cuLaunchKernel validates the geometry like CUDA (every dimension >= 1, block
 *   <= 1024 x 1024 x 64 and <= 1024 threads, grid y/z <= 65535, dynamic smem <= the
 *   function's MAX_DYNAMIC_SHARED_SIZE_BYTES: else CUDA_ERROR_INVALID_VALUE), requires
 *   extra == NULL (else CUDA_ERROR_NOT_SUPPORTED), and copies the parameter VALUES at the
 *   call using those sizes, each copy 64-byte aligned (a kernel without a size function
 *   cannot be launched: CUDA_ERROR_NOT_SUPPORTED). The kernel runs later on the stream's worker.
 * Streams: each stream (cuStreamCreate / cuStreamCreateWithPriority, flags 0 or
 *   CU_STREAM_NON_BLOCKING) owns one worker pthread and a FIFO of operations executed
 *   strictly in order: kernel launches, cuStreamWriteValue32(_v2), cuMemsetD32Async,
 *   cuMemcpy*Async, cuEventRecord markers and cuStreamWaitEvent waits. Different streams
 *   run concurrently. The NULL stream (0, and CU_STREAM_LEGACY / CU_STREAM_PER_THREAD)
 *   is one more ordinary stream, created on first use: there is NO legacy implicit
 *   synchronization with other streams. cuStreamDestroy(_v2) drains the stream and joins
 *   its worker before returning (CUDA returns at once and releases it later), so it
 *   blocks while the stream has work.
 * Stream capture (graph_emu.c): while a stream captures, enqueue() hands its operations
 *   to the capture graph instead of the FIFO (kernel launches, replayable vendor calls) or
 *   invalidates the capture (anything else); cuStreamSynchronize on it fails (900).
 * Events: cuEventRecord enqueues a marker; re-recording replaces the marker (a query,
 *   synchronize, wait or elapsed time refers to the latest record at the time of the
 *   call). An event never recorded is complete. cuStreamWaitEvent makes the stream wait
 *   until the marker recorded at the time of the call has been passed (flags must be 0).
 *   cuEventElapsedTime: milliseconds between the host CLOCK_MONOTONIC times at which the
 *   two markers were passed; CUDA_ERROR_INVALID_HANDLE if either event was never recorded
 *   or was created with CU_EVENT_DISABLE_TIMING, CUDA_ERROR_NOT_READY if either is pending.
 * Kernel failures: a kernel function returning nonzero marks its stream failed (sticky per
 *   stream, not per context): the first failed operation is remembered, later kernels on
 *   that stream are skipped (markers, waits, writes, memsets and copies still execute,
 *   so other streams never deadlock on it), cuStreamSynchronize / cuStreamQuery on the
 *   stream return CUDA_ERROR_LAUNCH_FAILED (719), and so do cuEventQuery /
 *   cuEventSynchronize / cuEventElapsedTime for markers recorded on it after (not
 *   before) the failed launch, once they are passed. cuCtxSynchronize returns 719 if any
 *   stream failed. avi_emu_driver_last_error() names the kernel and its return code.
 * Memory: device pointers are host pointers. cuMemAlloc_v2 / cuMemFree_v2 are
 *   aligned_alloc(256) / free; cuMemcpyHtoD_v2 / DtoH_v2 / DtoD_v2 and cuMemsetD32(_v2)
 *   run on the calling thread at once (not ordered with any stream: no legacy NULL-stream
 *   semantics); cuStreamWriteValue32 is a sequentially consistent 32-bit atomic store
 *   performed when the stream reaches it (flags 0 or NO_MEMORY_BARRIER).
 * Threads: every entry point may be called from any thread. Each stream has one mutex and
 *   two condition variables (work for its worker, progress for waiters); no lock is held
 *   while a kernel runs. Handles are checked with a magic word (a destroyed handle
 *   usually gives CUDA_ERROR_INVALID_HANDLE; a wild pointer is undefined, as in CUDA).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* -- driver types, declared by hand (no cuda.h) ------------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef struct emu_context* CUcontext;
typedef struct emu_stream* CUstream;
typedef struct emu_event* CUevent;
typedef struct emu_module* CUmodule;
typedef struct emu_function* CUfunction;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_UNKNOWN = 999,
};

enum { CU_STREAM_DEFAULT = 0, CU_STREAM_NON_BLOCKING = 1 };
enum {
    CU_EVENT_DEFAULT = 0,
    CU_EVENT_BLOCKING_SYNC = 1,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_EVENT_INTERPROCESS = 4,
};
enum { CU_STREAM_WRITE_VALUE_DEFAULT = 0, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER = 1 };
enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
    CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
    CU_FUNC_ATTRIBUTE_CACHE_MODE_CA = 7,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
    CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET = 10,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH = 11,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT = 12,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH = 13,
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
    CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 15,
    CU_FUNC_ATTRIBUTE_MAX = 16,
};

#define EMU_DRIVER_VERSION 12040
#define EMU_PRIO_LEAST 0
#define EMU_PRIO_GREATEST (-5)
#define EMU_MAX_THREADS 1024
#define EMU_DEFAULT_DYN_SMEM 49152
#define EMU_MAX_DYN_SMEM 232448
#define EMU_PARAM_ALIGN 64
#define EMU_WORKER_STACK (8u << 20)

#define MAGIC_STREAM 0x5354524dU /* 'STRM' */
#define MAGIC_EVENT 0x4556454eU  /* 'EVEN' */
#define MAGIC_MODULE 0x4d4f444cU /* 'MODL' */
#define MAGIC_FUNC 0x46554e43U   /* 'FUNC' */

typedef int (*emu_kernel_fn)(void**, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned);
typedef int (*emu_sizes_fn)(size_t*, int); /* also avi_emuparams_: unsigned long long* */
_Static_assert(sizeof(size_t) == sizeof(unsigned long long), "size_t must be 64-bit");
typedef int (*emu_abi_fn)(void);

/* -- diagnostics -------------------------------------------------------------------- */
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_err[1024];

static void set_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char* fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&g_err_mu);
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&g_err_mu);
}

/* Not a CUDA entry point: the last failure's explanation (module load, kernel failure). */
EXPORT const char* avi_emu_driver_last_error(void) {
    static _Thread_local char buf[sizeof g_err];
    pthread_mutex_lock(&g_err_mu);
    memcpy(buf, g_err, sizeof buf);
    pthread_mutex_unlock(&g_err_mu);
    return buf;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* -- errors ------------------------------------------------------------------------- */
struct err_entry {
    CUresult code;
    const char* name;
    const char* text;
};

static const struct err_entry g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT",
     "the launch timed out and was terminated"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct err_entry* find_err(CUresult e) {
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; ++i)
        if (g_errors[i].code == e) return &g_errors[i];
    return NULL;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    const struct err_entry* e = find_err(error);
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    const struct err_entry* e = find_err(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* -- context and device ------------------------------------------------------------- */
struct emu_context {
    int dummy;
};
static struct emu_context g_ctx;

EXPORT CUresult cuInit(unsigned int flags) {
    return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = EMU_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", "av_infer CUDA emulator (CPU)");
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = &g_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    (void)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice d) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = &g_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = EMU_PRIO_LEAST;
    if (greatest) *greatest = EMU_PRIO_GREATEST;
    return CUDA_SUCCESS;
}

/* -- modules and functions ---------------------------------------------------------- */
struct emu_function {
    uint32_t magic;
    struct emu_function* next;
    struct emu_module* mod;
    emu_kernel_fn fn;
    int nparams;         /* -1: no parameter-size function, cannot be launched */
    size_t* sizes;
    size_t pbytes;       /* bytes of the 64-byte aligned copies of all parameters */
    _Atomic int max_dyn_smem;
    _Atomic int carveout;
    char name[];
};

struct emu_module {
    uint32_t magic;
    atomic_int refs;     /* the handle + every launch not yet executed */
    atomic_int unloaded;
    pthread_mutex_t mu;  /* guards funcs */
    void* dl;
    struct emu_function* funcs;
};

static void module_ref(struct emu_module* m) { atomic_fetch_add(&m->refs, 1); }

static void module_unref(struct emu_module* m) {
    if (atomic_fetch_sub(&m->refs, 1) != 1) return;
    struct emu_function* f = m->funcs;
    while (f) {
        struct emu_function* nx = f->next;
        f->magic = 0;
        free(f->sizes);
        free(f);
        f = nx;
    }
    dlclose(m->dl);
    pthread_mutex_destroy(&m->mu);
    m->magic = 0;
    free(m);
}

/* Size of an ELF64 image from its headers; 0 if it is not one. */
static size_t elf_image_size(const unsigned char* p) {
    if (memcmp(p, ELFMAG, SELFMAG) != 0) return 0;
    if (p[EI_CLASS] != ELFCLASS64 || p[EI_DATA] != ELFDATA2LSB) return 0;
    Elf64_Ehdr eh;
    memcpy(&eh, p, sizeof eh);
    if (eh.e_type != ET_DYN) return 0;
    uint64_t end = sizeof eh;
    int have_sh = eh.e_shnum && eh.e_shentsize;
    if (have_sh) {
        uint64_t e = eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize;
        if (e > end) end = e;
    }
    uint64_t ph_end = eh.e_phoff + (uint64_t)eh.e_phnum * eh.e_phentsize;
    if (eh.e_phnum && eh.e_phentsize >= sizeof(Elf64_Phdr) && eh.e_phoff >= sizeof eh &&
        eh.e_phoff < ((uint64_t)1 << 32) && (!have_sh || ph_end <= end)) {
        /* program headers: inside the part known to exist, or the only size information */
        if (ph_end > end) end = ph_end;
        for (unsigned i = 0; i < eh.e_phnum; ++i) {
            Elf64_Phdr ph;
            memcpy(&ph, p + eh.e_phoff + (uint64_t)i * eh.e_phentsize, sizeof ph);
            uint64_t e = ph.p_offset + ph.p_filesz;
            if (ph.p_filesz && e > end) end = e;
        }
    }
    if (end > ((uint64_t)1 << 32)) return 0; /* a 4 GiB kernel module is a corrupt header */
    return (size_t)end;
}

static atomic_ulong g_module_serial;

/* Write the image to a private file in dir, dlopen it, unlink it. */
static void* dlopen_image(const char* dir, const unsigned char* p, size_t n, char* why,
                          size_t why_len) {
    char path[4096];
    unsigned long serial = atomic_fetch_add(&g_module_serial, 1);
    int len = snprintf(path, sizeof path, "%s/avi_emu_%ld_%lu_XXXXXX.so", dir, (long)getpid(),
                       serial);
    if (len <= 0 || (size_t)len >= sizeof path) {
        snprintf(why, why_len, "temp path too long in %s", dir);
        return NULL;
    }
    int fd = mkstemps(path, 3);
    if (fd < 0) {
        snprintf(why, why_len, "mkstemps in %s: %s", dir, strerror(errno));
        return NULL;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, p + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            snprintf(why, why_len, "write %.900s: %s", path, strerror(errno));
            close(fd);
            unlink(path);
            return NULL;
        }
        off += (size_t)w;
    }
    close(fd);
    void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char* e = dlerror();
        snprintf(why, why_len, "dlopen: %s", e ? e : "failed");
    }
    unlink(path);
    return dl;
}

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char* p = image;
    size_t n = elf_image_size(p);
    if (!n) {
        set_error("cuModuleLoadData: not an ELF64 little-endian shared object");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    const char* dirs[3] = {getenv("TMPDIR"), "/tmp", "/dev/shm"};
    char why[1024] = "", first[1024] = "";
    void* dl = NULL;
    for (int i = 0; i < 3 && !dl; ++i) {
        if (!dirs[i] || !*dirs[i]) continue;
        dl = dlopen_image(dirs[i], p, n, why, sizeof why);
        if (!dl && !first[0]) memcpy(first, why, sizeof first);
    }
    if (!dl) {
        set_error("cuModuleLoadData: %s", first);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    emu_abi_fn abi = (emu_abi_fn)dlsym(dl, "avi_emu_abi_version");
    int ver = abi ? abi() : -1;
    if (ver != 1) {
        dlclose(dl);
        if (abi)
            set_error("cuModuleLoadData: avi_emu_abi_version() = %d, expected 1", ver);
        else
            set_error("cuModuleLoadData: the module does not export avi_emu_abi_version");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    struct emu_module* m = calloc(1, sizeof *m);
    if (!m) {
        dlclose(dl);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->magic = MAGIC_MODULE;
    atomic_init(&m->refs, 1);
    atomic_init(&m->unloaded, 0);
    pthread_mutex_init(&m->mu, NULL);
    m->dl = dl;
    *module = m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
    if (!m || m->magic != MAGIC_MODULE) return CUDA_ERROR_INVALID_HANDLE;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&m->unloaded, &expected, 1))
        return CUDA_ERROR_INVALID_HANDLE;
    module_unref(m);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule m, const char* name) {
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!m || m->magic != MAGIC_MODULE || atomic_load(&m->unloaded))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&m->mu);
    struct emu_function* f;
    for (f = m->funcs; f; f = f->next)
        if (strcmp(f->name, name) == 0) break;
    if (!f) {
        size_t nl = strlen(name);
        char* sym = malloc(nl + 32);
        if (!sym) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        sprintf(sym, "avi_emu_%s", name);
        emu_kernel_fn fn = (emu_kernel_fn)dlsym(m->dl, sym);
        /* parameter sizes: avi_emuparams_<name> (docs/cuda_emu.md) */
        sprintf(sym, "avi_emuparams_%s", name);
        emu_sizes_fn sz = (emu_sizes_fn)dlsym(m->dl, sym);
        free(sym);
        if (!fn) {
            rc = CUDA_ERROR_NOT_FOUND;
            goto out;
        }
        f = calloc(1, sizeof *f + nl + 1);
        if (!f) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        memcpy(f->name, name, nl + 1);
        f->fn = fn;
        f->mod = m;
        f->nparams = -1;
        atomic_init(&f->max_dyn_smem, EMU_DEFAULT_DYN_SMEM);
        atomic_init(&f->carveout, -1);
        if (sz) {
            size_t buf[64];
            int np = sz(buf, 64);
            if (np < 0) {
                set_error("the parameter-size function of %s returned %d", name, np);
                free(f);
                rc = CUDA_ERROR_INVALID_IMAGE;
                goto out;
            }
            f->sizes = calloc((size_t)np + 1, sizeof(size_t));
            if (!f->sizes) {
                free(f);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
                goto out;
            }
            if (np > 64)
                sz(f->sizes, np);
            else
                memcpy(f->sizes, buf, (size_t)np * sizeof(size_t));
            f->nparams = np;
            for (int i = 0; i < np; ++i) f->pbytes += round_up(f->sizes[i], EMU_PARAM_ALIGN);
        }
        f->magic = MAGIC_FUNC;
        f->next = m->funcs;
        m->funcs = f;
    }
    *hfunc = f;
out:
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int func_ok(CUfunction f) {
    return f && f->magic == MAGIC_FUNC && !atomic_load(&f->mod->unloaded);
}

EXPORT CUresult cuFuncGetAttribute(int* pi, int attrib, CUfunction f) {
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (!func_ok(f)) return CUDA_ERROR_INVALID_HANDLE;
    switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = EMU_MAX_THREADS; break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = 0; break;
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *pi = 0; break;
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = 0; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = 80; break;
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 80; break;
        case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = 0; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            *pi = atomic_load(&f->max_dyn_smem);
            break;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
            *pi = atomic_load(&f->carveout);
            break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *pi = 0; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
    if (!func_ok(f)) return CUDA_ERROR_INVALID_HANDLE;
    switch (attrib) {
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            if (value < 0 || value > EMU_MAX_DYN_SMEM) return CUDA_ERROR_INVALID_VALUE;
            atomic_store(&f->max_dyn_smem, value);
            return CUDA_SUCCESS;
        case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
            if (value < -1 || value > 100) return CUDA_ERROR_INVALID_VALUE;
            atomic_store(&f->carveout, value);
            return CUDA_SUCCESS;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
}

static int occupancy(int threads) {
    if (threads > EMU_MAX_THREADS) return 0;
    int n = 2048 / threads;
    return n > 32 ? 32 : (n < 1 ? 1 : n);
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int threads,
                                                            size_t smem) {
    (void)smem;
    if (!n || threads <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!func_ok(f)) return CUDA_ERROR_INVALID_HANDLE;
    *n = occupancy(threads);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, CUfunction f,
                                                                     int threads, size_t smem,
                                                                     unsigned flags) {
    (void)flags;
    return cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, threads, smem);
}

/* -- streams ------------------------------------------------------------------------ */
enum op_kind { OP_KERNEL, OP_WRITE32, OP_MEMSET32, OP_MEMCPY, OP_RECORD, OP_WAIT, OP_HOST };

/* A host operation (the emulated vendor libraries, vendor_emu.c): fn(data, run) runs on the
 * stream's worker in stream order; run = 0 when an earlier launch failed on the stream (fn
 * only frees data then); a nonzero return fails the stream like a failing kernel. */
typedef int (*emu_host_fn)(void* data, int run);

struct emu_event;

struct op {
    struct op* next;
    uint64_t seq;
    int kind;
    union {
        struct {
            struct emu_function* f;
            unsigned g[3], b[3], smem;
            void** params;
        } k;
        struct {
            uint32_t* addr;
            uint32_t value;
        } w;
        struct {
            uint32_t* dst;
            uint32_t value;
            size_t n;
        } ms;
        struct {
            void* dst;
            const void* src;
            size_t n;
        } mc;
        struct {
            struct emu_event* ev;
            uint64_t gen;
        } rec;
        struct {
            struct emu_stream* src;
            uint64_t seq;
        } wait;
        struct {
            emu_host_fn fn;
            void* data;
            int replay; /* may be captured into a graph and run many times (mode 3) */
        } host;
    } u;
};

struct emu_stream {
    uint32_t magic;
    atomic_int refs;            /* the handle + events recorded on it + pending waits on it */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;     /* the worker waits for operations */
    pthread_cond_t done_cv;     /* synchronizers / waiting streams wait for progress */
    struct op* head;
    struct op* tail;
    uint64_t enq;               /* operations enqueued (guarded by mu) */
    _Atomic uint64_t done;      /* operations executed (written under mu) */
    _Atomic uint64_t err_seq;   /* seq of the first failed launch, 0 = none */
    int done_waiters;
    int stop;
    unsigned flags;
    int priority;
    int is_default;
    pthread_t thread;
    struct emu_stream* reg_prev;
    struct emu_stream* reg_next;
    struct emu_graph* capture;  /* stream capture in progress (graph_emu.c), guarded by mu */
    CUresult capture_err;       /* the capture was invalidated by an uncapturable operation */
    int capture_into;           /* cuStreamBeginCaptureToGraph: the graph is the caller's */
};

/* Stream capture (graph_emu.c): an operation enqueued on a capturing stream becomes a
 * node of the capture graph instead of running (1), or invalidates the capture (0: the
 * caller frees it and fails the call). Called with s->mu held. */
struct emu_graph;
static int capture_op(struct emu_stream* s, struct op* op);

struct emu_event {
    uint32_t magic;
    atomic_int refs;            /* the handle + pending record operations */
    atomic_int destroyed;       /* cuEventDestroy was called (the handle is dead) */
    pthread_mutex_t mu;
    unsigned flags;
    uint64_t gen;               /* number of cuEventRecord calls */
    struct emu_stream* st;      /* stream of the latest record (holds a reference) */
    uint64_t seq;               /* its operation number there */
    uint64_t t_gen;             /* the record whose passing time t_ns holds */
    int64_t t_ns;
};

static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct emu_stream* g_reg_head;
static struct emu_stream* g_default;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;
static atomic_uint g_stream_serial;

static void stream_ref(struct emu_stream* s) { atomic_fetch_add(&s->refs, 1); }

static void stream_unref(struct emu_stream* s) {
    if (atomic_fetch_sub(&s->refs, 1) != 1) return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    s->magic = 0;
    free(s);
}

static void event_ref(struct emu_event* e) { atomic_fetch_add(&e->refs, 1); }

static void event_unref(struct emu_event* e) {
    if (atomic_fetch_sub(&e->refs, 1) != 1) return;
    if (e->st) stream_unref(e->st);
    pthread_mutex_destroy(&e->mu);
    e->magic = 0;
    free(e);
}

/* Wait until stream s has executed its first `target` operations. */
static void wait_done(struct emu_stream* s, uint64_t target) {
    if (atomic_load(&s->done) >= target) return;
    pthread_mutex_lock(&s->mu);
    s->done_waiters++;
    while (atomic_load(&s->done) < target) pthread_cond_wait(&s->done_cv, &s->mu);
    s->done_waiters--;
    pthread_mutex_unlock(&s->mu);
}

/* A failure at or before operation seq of stream s (0: none)? */
static int failed_by(struct emu_stream* s, uint64_t seq) {
    uint64_t e = atomic_load(&s->err_seq);
    return e != 0 && e <= seq;
}

static void run_op(struct emu_stream* s, struct op* op) {
    switch (op->kind) {
        case OP_KERNEL: {
            struct emu_function* f = op->u.k.f;
            if (atomic_load(&s->err_seq) == 0) {
                int rc = f->fn(op->u.k.params, op->u.k.g[0], op->u.k.g[1], op->u.k.g[2],
                               op->u.k.b[0], op->u.k.b[1], op->u.k.b[2], op->u.k.smem);
                if (rc != 0) {
                    uint64_t zero = 0;
                    atomic_compare_exchange_strong(&s->err_seq, &zero, op->seq);
                    set_error("kernel %s returned %d (stream %p, launch #%llu): the stream "
                              "reports CUDA_ERROR_LAUNCH_FAILED from now on",
                              f->name, rc, (void*)s, (unsigned long long)op->seq);
                }
            }
            module_unref(f->mod);
            break;
        }
        case OP_WRITE32:
            __atomic_store_n(op->u.w.addr, op->u.w.value, __ATOMIC_SEQ_CST);
            break;
        case OP_MEMSET32:
            for (size_t i = 0; i < op->u.ms.n; ++i) op->u.ms.dst[i] = op->u.ms.value;
            atomic_thread_fence(memory_order_seq_cst);
            break;
        case OP_MEMCPY:
            memmove(op->u.mc.dst, op->u.mc.src, op->u.mc.n);
            atomic_thread_fence(memory_order_seq_cst);
            break;
        case OP_RECORD: {
            struct emu_event* e = op->u.rec.ev;
            pthread_mutex_lock(&e->mu);
            if (e->gen == op->u.rec.gen) {
                e->t_ns = now_ns();
                e->t_gen = op->u.rec.gen;
            }
            pthread_mutex_unlock(&e->mu);
            event_unref(e);
            break;
        }
        case OP_WAIT:
            wait_done(op->u.wait.src, op->u.wait.seq);
            stream_unref(op->u.wait.src);
            break;
        case OP_HOST: {
            int ok = atomic_load(&s->err_seq) == 0;
            int rc = op->u.host.fn(op->u.host.data, ok);
            if (ok && rc != 0) {
                uint64_t zero = 0;
                atomic_compare_exchange_strong(&s->err_seq, &zero, op->seq);
                set_error("vendor operation returned %d (stream %p, op #%llu): the stream "
                          "reports CUDA_ERROR_LAUNCH_FAILED from now on", rc, (void*)s,
                          (unsigned long long)op->seq);
            }
            atomic_thread_fence(memory_order_seq_cst);
            break;
        }
    }
}

static void* stream_worker(void* arg) {
    struct emu_stream* s = arg;
    char name[16];
    snprintf(name, sizeof name, "avi-emu-s%u", atomic_fetch_add(&g_stream_serial, 1));
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
        struct op* op = s->head;
        if (!op) break; /* stopped and drained */
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        uint64_t seq = op->seq;
        run_op(s, op); /* no lock held while a kernel runs */
        free(op);
        pthread_mutex_lock(&s->mu);
        atomic_store(&s->done, seq);
        if (s->done_waiters) pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static struct emu_stream* stream_new(unsigned flags, int priority, int is_default) {
    struct emu_stream* s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->magic = MAGIC_STREAM;
    atomic_init(&s->refs, 1);
    atomic_init(&s->done, 0);
    atomic_init(&s->err_seq, 0);
    s->flags = flags;
    s->priority = priority;
    s->is_default = is_default;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, EMU_WORKER_STACK);
    int rc = pthread_create(&s->thread, &attr, stream_worker, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        set_error("pthread_create: %s", strerror(rc));
        stream_unref(s);
        return NULL;
    }
    pthread_mutex_lock(&g_reg_mu);
    s->reg_next = g_reg_head;
    if (g_reg_head) g_reg_head->reg_prev = s;
    g_reg_head = s;
    pthread_mutex_unlock(&g_reg_mu);
    return s;
}

static void make_default_stream(void) { g_default = stream_new(0, EMU_PRIO_LEAST, 1); }

/* The stream a handle names: NULL, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2) -> the
 * default stream; NULL result = invalid handle. */
static struct emu_stream* resolve(CUstream h) {
    if ((uintptr_t)h <= 2) {
        pthread_once(&g_default_once, make_default_stream);
        return g_default;
    }
    return h->magic == MAGIC_STREAM ? h : NULL;
}

/* Append op; returns its seq, or 0 if the stream is being destroyed. */
static uint64_t enqueue(struct emu_stream* s, struct op* op) {
    uint64_t seq = 0;
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->capture) {
        int ok = !s->stop && capture_op(s, op);
        pthread_mutex_unlock(&s->mu);
        return ok ? UINT64_MAX : 0; /* captured: nothing enqueued (no seq to wait for) */
    }
    if (!s->stop) {
        seq = op->seq = ++s->enq;
        if (s->tail)
            s->tail->next = op;
        else
            s->head = op;
        s->tail = op;
        pthread_cond_signal(&s->work_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return seq;
}

static CUresult enqueue_simple(CUstream h, struct op* op) {
    struct emu_stream* s = resolve(h);
    if (!s) {
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (!enqueue(s, op)) {
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream* ph, unsigned int flags, int priority) {
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    if (priority > EMU_PRIO_LEAST) priority = EMU_PRIO_LEAST;
    if (priority < EMU_PRIO_GREATEST) priority = EMU_PRIO_GREATEST;
    struct emu_stream* s = stream_new(flags, priority, 0);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
    return cuStreamCreateWithPriority(ph, flags, EMU_PRIO_LEAST);
}

EXPORT CUresult cuStreamGetPriority(CUstream h, int* priority) {
    struct emu_stream* s = resolve(h);
    if (!priority) return CUDA_ERROR_INVALID_VALUE;
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    *priority = s->priority;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned int* flags) {
    struct emu_stream* s = resolve(h);
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    *flags = s->flags;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream h) {
    if ((uintptr_t)h <= 2 || h->magic != MAGIC_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    struct emu_stream* s = h;
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    s->stop = 1;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* the worker drains the queue, then exits */
    pthread_mutex_lock(&g_reg_mu);
    if (s->reg_prev) s->reg_prev->reg_next = s->reg_next;
    else g_reg_head = s->reg_next;
    if (s->reg_next) s->reg_next->reg_prev = s->reg_prev;
    pthread_mutex_unlock(&g_reg_mu);
    stream_unref(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy(CUstream h) { return cuStreamDestroy_v2(h); }

EXPORT CUresult cuStreamQuery(CUstream h) {
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    uint64_t enq = s->enq;
    pthread_mutex_unlock(&s->mu);
    if (atomic_load(&s->done) < enq) return CUDA_ERROR_NOT_READY;
    return atomic_load(&s->err_seq) ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream h) {
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    if (s->capture) { /* CUDA: not permitted while capturing; invalidates the capture */
        s->capture_err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        pthread_mutex_unlock(&s->mu);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    uint64_t target = s->enq;
    pthread_mutex_unlock(&s->mu);
    wait_done(s, target);
    return atomic_load(&s->err_seq) ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    pthread_once(&g_default_once, make_default_stream);
    size_t n = 0, cap = 16;
    struct emu_stream** v = malloc(cap * sizeof *v);
    uint64_t* t = malloc(cap * sizeof *t);
    if (!v || !t) {
        free(v);
        free(t);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&g_reg_mu);
    for (struct emu_stream* s = g_reg_head; s; s = s->reg_next) {
        if (n == cap) {
            cap *= 2;
            struct emu_stream** v2 = realloc(v, cap * sizeof *v);
            if (v2) v = v2;
            uint64_t* t2 = realloc(t, cap * sizeof *t);
            if (t2) t = t2;
            if (!v2 || !t2) break;
        }
        stream_ref(s);
        pthread_mutex_lock(&s->mu);
        t[n] = s->enq;
        pthread_mutex_unlock(&s->mu);
        v[n++] = s;
    }
    pthread_mutex_unlock(&g_reg_mu);
    CUresult rc = CUDA_SUCCESS;
    for (size_t i = 0; i < n; ++i) {
        wait_done(v[i], t[i]);
        if (atomic_load(&v[i]->err_seq)) rc = CUDA_ERROR_LAUNCH_FAILED;
        stream_unref(v[i]);
    }
    free(v);
    free(t);
    return rc;
}

/* -- launches ----------------------------------------------------------------------- */
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz,
                               unsigned int smem, CUstream h, void** kernelParams,
                               void** extra) {
    if (!func_ok(f)) return CUDA_ERROR_INVALID_HANDLE;
    if (extra) {
        set_error("cuLaunchKernel: `extra` is not supported by the emulator");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (f->nparams < 0) {
        set_error("cuLaunchKernel: %s has no avi_emuparams_%s (docs/cuda_emu.md)",
                  f->name, f->name);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if (bx > 1024 || by > 1024 || bz > 64 ||
        (uint64_t)bx * by * bz > (uint64_t)EMU_MAX_THREADS)
        return CUDA_ERROR_INVALID_VALUE;
    if (gx > 0x7fffffffU || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
    if (smem > (unsigned)atomic_load(&f->max_dyn_smem)) return CUDA_ERROR_INVALID_VALUE;
    if (f->nparams > 0 && !kernelParams) return CUDA_ERROR_INVALID_VALUE;
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;

    int np = f->nparams;
    size_t head = round_up(sizeof(struct op), EMU_PARAM_ALIGN);
    size_t total = round_up(head + f->pbytes + (size_t)np * sizeof(void*), EMU_PARAM_ALIGN);
    struct op* op = aligned_alloc(EMU_PARAM_ALIGN, total);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(op, 0, sizeof *op);
    op->kind = OP_KERNEL;
    op->u.k.f = f;
    op->u.k.g[0] = gx, op->u.k.g[1] = gy, op->u.k.g[2] = gz;
    op->u.k.b[0] = bx, op->u.k.b[1] = by, op->u.k.b[2] = bz;
    op->u.k.smem = smem;
    char* vals = (char*)op + head;
    void** ptrs = (void**)(vals + f->pbytes);
    size_t off = 0;
    for (int i = 0; i < np; ++i) {
        if (!kernelParams[i] && f->sizes[i]) {
            free(op);
            return CUDA_ERROR_INVALID_VALUE;
        }
        memcpy(vals + off, kernelParams[i], f->sizes[i]);
        ptrs[i] = vals + off;
        off += round_up(f->sizes[i], EMU_PARAM_ALIGN);
    }
    op->u.k.params = np ? ptrs : NULL;
    module_ref(f->mod);
    if (!enqueue(s, op)) {
        module_unref(f->mod);
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return CUDA_SUCCESS;
}

/* -- stream memory operations ------------------------------------------------------- */
static struct op* new_op(int kind) {
    struct op* op = calloc(1, sizeof *op);
    if (op) op->kind = kind;
    return op;
}

EXPORT CUresult cuStreamWriteValue32_v2(CUstream h, CUdeviceptr addr, uint32_t value,
                                        unsigned int flags) {
    if (!addr || (addr & 3) || (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER))
        return CUDA_ERROR_INVALID_VALUE;
    struct op* op = new_op(OP_WRITE32);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.w.addr = (uint32_t*)(uintptr_t)addr;
    op->u.w.value = value;
    return enqueue_simple(h, op);
}

EXPORT CUresult cuStreamWriteValue32(CUstream h, CUdeviceptr addr, uint32_t value,
                                     unsigned int flags) {
    return cuStreamWriteValue32_v2(h, addr, value, flags);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream h) {
    if ((!dst && n) || (dst & 3)) return CUDA_ERROR_INVALID_VALUE;
    struct op* op = new_op(OP_MEMSET32);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.ms.dst = (uint32_t*)(uintptr_t)dst;
    op->u.ms.value = value;
    op->u.ms.n = n;
    return enqueue_simple(h, op);
}

/* Enqueue a host operation on stream h (vendor_emu.c); on failure data is NOT freed.
 * fn(data, mode): mode bit 0 = run it, bit 1 = keep data (else fn frees it). ``replay``:
 * fn supports mode 3 (run, keep), so a capturing stream may record it as a graph node
 * that runs at every launch of the graph and frees data (mode 0) when the graph dies. */
static CUresult emu_enqueue_host_r(CUstream h, emu_host_fn fn, void* data, int replay) {
    struct op* op = new_op(OP_HOST);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.host.fn = fn;
    op->u.host.data = data;
    op->u.host.replay = replay;
    return enqueue_simple(h, op);
}

static CUresult emu_enqueue_host(CUstream h, emu_host_fn fn, void* data) {
    return emu_enqueue_host_r(h, fn, data, 0);
}

EXPORT CUresult cuMemsetD32Async_v2(CUdeviceptr dst, unsigned int value, size_t n,
                                    CUstream h) {
    return cuMemsetD32Async(dst, value, n, h);
}

static CUresult memcpy_async(void* dst, const void* src, size_t n, CUstream h) {
    if ((!dst || !src) && n) return CUDA_ERROR_INVALID_VALUE;
    struct op* op = new_op(OP_MEMCPY);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.mc.dst = dst;
    op->u.mc.src = src;
    op->u.mc.n = n;
    return enqueue_simple(h, op);
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    return memcpy_async((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n, h);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream h) {
    return memcpy_async((void*)(uintptr_t)dst, src, n, h);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream h) {
    return memcpy_async(dst, (const void*)(uintptr_t)src, n, h);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    return memcpy_async((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n, h);
}

/* -- synchronous memory (host memory; not ordered with any stream) ------------------- */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t n) {
    if (!dptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
    void* p = aligned_alloc(256, round_up(n, 256));
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    free((void*)(uintptr_t)p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    if ((!dst || !src) && n) return CUDA_ERROR_INVALID_VALUE;
    if (n) memmove((void*)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    if ((!dst || !src) && n) return CUDA_ERROR_INVALID_VALUE;
    if (n) memmove(dst, (const void*)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    if ((!dst || !src) && n) return CUDA_ERROR_INVALID_VALUE;
    if (n) memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) {
    if ((!dst && n) || (dst & 3)) return CUDA_ERROR_INVALID_VALUE;
    uint32_t* p = (uint32_t*)(uintptr_t)dst;
    for (size_t i = 0; i < n; ++i) p[i] = value;
    atomic_thread_fence(memory_order_seq_cst);
    return CUDA_SUCCESS;
}

/* Same 64-bit prototype as the _v2 entry point. */
EXPORT CUresult cuMemsetD32(CUdeviceptr dst, unsigned int value, size_t n) {
    return cuMemsetD32_v2(dst, value, n);
}

/* -- events ------------------------------------------------------------------------- */
EXPORT CUresult cuEventCreate(CUevent* ph, unsigned int flags) {
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                            CU_EVENT_INTERPROCESS))
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_EVENT_INTERPROCESS) return CUDA_ERROR_NOT_SUPPORTED;
    struct emu_event* e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = MAGIC_EVENT;
    atomic_init(&e->refs, 1);
    atomic_init(&e->destroyed, 0);
    pthread_mutex_init(&e->mu, NULL);
    e->flags = flags;
    *ph = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    if (!e || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&e->destroyed, &expected, 1))
        return CUDA_ERROR_INVALID_HANDLE;
    event_unref(e); /* freed now, or when its pending record has executed */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

static int event_live(CUevent e) {
    return e && e->magic == MAGIC_EVENT && !atomic_load(&e->destroyed);
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream h) {
    if (!event_live(e)) return CUDA_ERROR_INVALID_HANDLE;
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    struct op* op = new_op(OP_RECORD);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&e->mu);
    uint64_t gen = e->gen + 1;
    op->u.rec.ev = e;
    op->u.rec.gen = gen;
    event_ref(e);
    uint64_t seq = enqueue(s, op); /* lock order: event, then stream */
    if (!seq) {
        pthread_mutex_unlock(&e->mu);
        atomic_fetch_sub(&e->refs, 1); /* the handle still holds one */
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct emu_stream* old = e->st;
    stream_ref(s);
    e->st = s;
    e->seq = seq;
    e->gen = gen;
    pthread_mutex_unlock(&e->mu);
    if (old) stream_unref(old);
    return CUDA_SUCCESS;
}

/* 0, NOT_READY or LAUNCH_FAILED for the latest record; call with e->mu held. */
static CUresult event_status_locked(struct emu_event* e) {
    if (!e->st) return CUDA_SUCCESS;
    if (atomic_load(&e->st->done) < e->seq) return CUDA_ERROR_NOT_READY;
    return failed_by(e->st, e->seq) ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent e) {
    if (!event_live(e)) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->mu);
    CUresult rc = event_status_locked(e);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    if (!event_live(e)) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->mu);
    struct emu_stream* s = e->st;
    uint64_t seq = e->seq;
    if (s) stream_ref(s);
    pthread_mutex_unlock(&e->mu);
    if (!s) return CUDA_SUCCESS;
    wait_done(s, seq);
    CUresult rc = failed_by(s, seq) ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS;
    stream_unref(s);
    return rc;
}

EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!event_live(e)) return CUDA_ERROR_INVALID_HANDLE;
    struct emu_stream* s = resolve(h);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->mu);
    struct emu_stream* src = e->st;
    uint64_t seq = e->seq;
    if (src) stream_ref(src);
    pthread_mutex_unlock(&e->mu);
    /* never recorded, recorded on this very stream (FIFO order), or already passed */
    if (!src || src == s || atomic_load(&src->done) >= seq) {
        if (src) stream_unref(src);
        return CUDA_SUCCESS;
    }
    struct op* op = new_op(OP_WAIT);
    if (!op) {
        stream_unref(src);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->u.wait.src = src; /* the reference moves into the operation */
    op->u.wait.seq = seq;
    if (!enqueue(s, op)) {
        stream_unref(src);
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!event_live(start) || !event_live(end)) return CUDA_ERROR_INVALID_HANDLE;
    int64_t t[2];
    CUevent ev[2] = {start, end};
    CUresult worst = CUDA_SUCCESS;
    for (int i = 0; i < 2; ++i) {
        struct emu_event* e = ev[i];
        pthread_mutex_lock(&e->mu);
        CUresult rc = CUDA_SUCCESS;
        if ((e->flags & CU_EVENT_DISABLE_TIMING) || !e->st)
            rc = CUDA_ERROR_INVALID_HANDLE;
        else
            rc = event_status_locked(e);
        t[i] = e->t_ns;
        pthread_mutex_unlock(&e->mu);
        if (rc == CUDA_ERROR_INVALID_HANDLE) return rc;
        if (rc != CUDA_SUCCESS && worst != CUDA_ERROR_NOT_READY) worst = rc;
    }
    if (worst != CUDA_SUCCESS) return worst;
    *ms = (float)((double)(t[1] - t[0]) / 1e6);
    return CUDA_SUCCESS;
}

/* The emulated cuBLASLt / cuDNN entry points (docs/cuda_emu.md section 3). */
#include "vendor_emu.c"

/* CUDA graphs with conditional nodes: a sequential executor (docs/cuda_graphs.md). */
#include "graph_emu.c"
