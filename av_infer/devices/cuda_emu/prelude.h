// av_infer CUDA emulator: CUDA built-ins for the host C++ compiler (docs/cuda_emu.md §1).
//
// HostKernelCompiler prepends this file to a generated CUDA source (compiled with
// -DAVI_HOST_EMU) and appends one `avi_emu_<kernel>` trampoline per extern "C" __global__
// kernel. Execution model: a launch runs its blocks one after another on the calling OS
// thread; the threads of a block are fibers (hand-written x86-64 context switch, ucontext
// elsewhere) switched only at barriers and warp collectives, so __syncthreads, warp
// shuffles and mma.sync have CUDA's semantics (threads that returned count as arrived).
// Every piece of emulator state -- the scheduler, the fiber pool and `__shared__` memory
// (static thread_local) -- is per OS thread: two streams may run the same module at once.
#ifndef AVI_EMU_PRELUDE_H
#define AVI_EMU_PRELUDE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <type_traits>
#include <utility>
#if !defined(__x86_64__) || defined(AVI_EMU_UCONTEXT)
#define AVI_EMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

// ---- qualifiers -------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static thread_local
#define __constant__ static
#define __managed__

#define AVI_EMU_HIDDEN __attribute__((visibility("hidden")))
#define AVI_EMU_EXPORT extern "C" __attribute__((visibility("default")))

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };

namespace avi_emu {

enum { MAX_THREADS = 1024, STACK_BYTES = 64 * 1024 };
enum { S_RUN = 0, S_BAR = 1, S_WARP = 2, S_DONE = 3 };  // fiber states
enum { W_SYNC = 0, W_IDX, W_XOR, W_UP, W_DOWN, W_BALLOT, W_ANY, W_ALL, W_MMA };  // collectives
enum { E_INVALID_VALUE = 1, E_OUT_OF_MEMORY = 2, E_LAUNCH_FAILED = 719 };  // CUresult values

struct Fiber {
    void* sp;             // saved stack pointer (x86-64 switch)
    char* stack;          // lowest usable byte (a PROT_NONE guard page lies below)
    uint3 tid;
    unsigned lin;         // linear thread index in the block
    int state;
    int op, arg, width;   // this lane's pending warp collective
    unsigned in[10];      // its operands (shuffle: in[0..1]; mma: a0..a3 b0 b1 c0..c3)
    unsigned out[4];      // its results
#ifdef AVI_EMU_USE_UCONTEXT
    ucontext_t uc;
#endif
};

struct Warp { int live, arrived; };

struct Sched {
    Fiber* fib;           // pool: MAX_THREADS fibers, stacks mapped on first use
    int nstacks;
    int n, live, bar_arrived, error, active;
    Fiber* cur;
    void* main_sp;
#ifdef AVI_EMU_USE_UCONTEXT
    ucontext_t main_uc;
#endif
    uint3 bid;
    dim3 bdim, gdim;
    void (*body)(void*);
    void* closure;
    Warp warps[MAX_THREADS / 32];
    unsigned rng;
    short order[MAX_THREADS];  // resume order of a pass (schedules 1 and 2)
};

// Resume order of the fibers of a block (avi_emu_set_schedule): 0 thread order, 1 reverse,
// 2 a fresh pseudo-random permutation every pass. A correct kernel gives the same bits
// under all three; one that differs depends on thread interleaving (a missing barrier).
static int g_schedule = 0;
static unsigned g_seed = 0;

// External linkage (hidden): the compiler must assume the opaque context switch reads and
// writes it, so nothing of it is cached across a switch.
AVI_EMU_HIDDEN extern thread_local Sched S;
thread_local Sched S;

}  // namespace avi_emu

#define threadIdx (::avi_emu::S.cur->tid)
#define blockIdx (::avi_emu::S.bid)
#define blockDim (::avi_emu::S.bdim)
#define gridDim (::avi_emu::S.gdim)
#define warpSize 32

// ---- the context switch -----------------------------------------------------------------
#ifndef AVI_EMU_USE_UCONTEXT
// void avi_emu_switch(void** save_sp, void* to_sp): push the callee-saved registers, save
// rsp, load the other stack, pop its registers, return into it.
extern "C" AVI_EMU_HIDDEN void avi_emu_switch(void** save_sp, void* to_sp);
__asm__(
    ".pushsection .text\n"
    ".p2align 4\n"
    ".globl avi_emu_switch\n"
    ".hidden avi_emu_switch\n"
    ".type avi_emu_switch,@function\n"
    "avi_emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size avi_emu_switch, .-avi_emu_switch\n"
    ".popsection\n");
#endif

namespace avi_emu {

static void fiber_main();

// Back to the scheduler (the fiber's state says why).
static inline void yield(Fiber* me) {
#ifdef AVI_EMU_USE_UCONTEXT
    swapcontext(&me->uc, &S.main_uc);
#else
    avi_emu_switch(&me->sp, S.main_sp);
#endif
    __asm__ __volatile__("" ::: "memory");
}

static inline void resume(Fiber* f) {
    S.cur = f;
#ifdef AVI_EMU_USE_UCONTEXT
    swapcontext(&S.main_uc, &f->uc);
#else
    avi_emu_switch(&S.main_sp, f->sp);
#endif
    __asm__ __volatile__("" ::: "memory");
}

// A fresh context on f's stack that starts in fiber_main.
static inline void fiber_init(Fiber* f) {
#ifdef AVI_EMU_USE_UCONTEXT
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK_BYTES;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, (void (*)())fiber_main, 0);
#else
    uintptr_t top = ((uintptr_t)f->stack + STACK_BYTES) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;                  // fiber_main's return address (it never returns)
    *--sp = (void*)&fiber_main;       // popped by `ret`: rsp % 16 == 8 at entry, as after a call
    for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
    f->sp = sp;
#endif
}

// ---- fiber pool (per OS thread; unmapped at thread exit) ----------------------------------
struct PoolOwner {
    ~PoolOwner() {
        Sched& s = S;
        if (!s.fib) return;
        const size_t page = 4096;
        for (int i = 0; i < s.nstacks; ++i) munmap(s.fib[i].stack - page, STACK_BYTES + page);
        free(s.fib);
        s.fib = nullptr;
        s.nstacks = 0;
    }
};

static bool ensure_pool(int n) {
    Sched& s = S;
    if (!s.fib) {
        static thread_local PoolOwner owner;  // its destructor frees the pool
        (void)&owner;
        s.fib = (Fiber*)calloc(MAX_THREADS, sizeof(Fiber));
        if (!s.fib) return false;
    }
    const size_t page = 4096;
    while (s.nstacks < n) {
        void* m = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, page, PROT_NONE);  // guard page: an overflow faults instead of corrupting
        s.fib[s.nstacks++].stack = (char*)m + page;
    }
    return true;
}

// ---- barriers and warp collectives ---------------------------------------------------------
static void release_bar(Sched& s) {
    s.bar_arrived = 0;
    for (int i = 0; i < s.n; ++i)
        if (s.fib[i].state == S_BAR) s.fib[i].state = S_RUN;
}

static inline float tf32_value(unsigned bits) {  // the tensor core reads the tf32 bits only
    bits &= 0xffffe000u;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// D = A * B + C for one m16n8k8 TF32 mma, fragments per the PTX ISA (groupID = lane >> 2,
// threadID_in_group = lane % 4): A a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4);
// B b0 (t, g) b1 (t+4, g); C/D c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1).
// Products of tf32 values are exact in float; they are added to C in k order, each sum
// rounded to nearest even (the hardware's internal order/precision is not specified).
static void mma_m16n8k8(Fiber* w) {
    float A[16][8], B[8][8], D[16][8];
    for (int l = 0; l < 32; ++l) {
        const unsigned* in = w[l].in;
        const int g = l >> 2, t = l & 3;
        A[g][t] = tf32_value(in[0]);
        A[g + 8][t] = tf32_value(in[1]);
        A[g][t + 4] = tf32_value(in[2]);
        A[g + 8][t + 4] = tf32_value(in[3]);
        B[t][g] = tf32_value(in[4]);
        B[t + 4][g] = tf32_value(in[5]);
        memcpy(&D[g][2 * t], &in[6], 8);
        memcpy(&D[g + 8][2 * t], &in[8], 8);
    }
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
            float d = D[i][j];
            for (int k = 0; k < 8; ++k) d = d + A[i][k] * B[k][j];  // product exact
            D[i][j] = d;
        }
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        memcpy(&w[l].out[0], &D[g][2 * t], 8);
        memcpy(&w[l].out[2], &D[g + 8][2 * t], 8);
    }
}

// All live lanes of warp wi have arrived: compute every lane's result, wake them.
static void complete_warp(Sched& s, int wi) {
    Fiber* w = s.fib + wi * 32;
    const int cnt = s.n - wi * 32 < 32 ? s.n - wi * 32 : 32;
    unsigned votes = 0;
    bool mma = false;
    for (int l = 0; l < cnt; ++l) {
        if (w[l].state == S_DONE) continue;
        if (w[l].op == W_MMA) mma = true;
        if (w[l].in[0]) votes |= 1u << l;
    }
    if (mma) {
        bool full = cnt == 32;
        for (int l = 0; l < cnt && full; ++l) full = w[l].state != S_DONE && w[l].op == W_MMA;
        if (full) mma_m16n8k8(w);
        else s.error = E_LAUNCH_FAILED;  // mma.sync.aligned needs all 32 lanes
    }
    for (int l = 0; l < cnt; ++l) {
        Fiber& f = w[l];
        if (f.state == S_DONE) continue;
        const int width = f.width, seg = l & ~(width - 1), pos = l & (width - 1);
        int src = l;
        switch (f.op) {
            case W_IDX: src = seg + (f.arg & (width - 1)); break;
            case W_XOR: src = l ^ f.arg; if (src >= seg + width) src = l; break;
            case W_UP: src = pos >= f.arg ? l - f.arg : l; break;
            case W_DOWN: src = pos + f.arg < width ? l + f.arg : l; break;
            case W_BALLOT: f.out[0] = votes; break;
            case W_ANY: f.out[0] = votes != 0; break;
            case W_ALL: {
                unsigned live = 0;
                for (int q = 0; q < cnt; ++q) if (w[q].state != S_DONE) live |= 1u << q;
                f.out[0] = votes == live;
                break;
            }
            default: break;
        }
        if (f.op >= W_IDX && f.op <= W_DOWN) {
            if (src < 0 || src >= cnt || w[src].state == S_DONE) src = l;  // undefined on a GPU
            f.out[0] = w[src].in[0];
            f.out[1] = w[src].in[1];
        }
        if (f.state == S_WARP) f.state = S_RUN;
    }
    s.warps[wi].arrived = 0;
}

// The calling fiber joins a warp collective (its op/in are set); returns with out filled.
static inline void warp_collective(Fiber* me) {
    Sched& s = S;
    Warp& w = s.warps[me->lin >> 5];
    if (++w.arrived == w.live) {
        complete_warp(s, (int)(me->lin >> 5));
        return;
    }
    me->state = S_WARP;
    yield(me);
}

[[noreturn]] static void fiber_exit() {
    Sched& s = S;
    Fiber* me = s.cur;
    me->state = S_DONE;
    --s.live;
    Warp& w = s.warps[me->lin >> 5];
    --w.live;
    if (s.bar_arrived > 0 && s.bar_arrived == s.live) release_bar(s);
    if (w.arrived > 0 && w.arrived == w.live) complete_warp(s, (int)(me->lin >> 5));
    yield(me);
    __builtin_trap();  // a finished fiber is never resumed
}

static void fiber_main() {
    S.body(S.closure);
    fiber_exit();
}

// One block: every thread a fiber, round-robin until all returned (or none can run).
static int run_block(Sched& s) {
    const int n = s.n;
    const dim3 bd = s.bdim;
    for (int i = 0; i < n; ++i) {
        Fiber& f = s.fib[i];
        f.lin = (unsigned)i;
        f.tid.x = (unsigned)i % bd.x;
        f.tid.y = ((unsigned)i / bd.x) % bd.y;
        f.tid.z = (unsigned)i / (bd.x * bd.y);
        f.state = S_RUN;
        fiber_init(&f);
    }
    for (int wi = 0; wi * 32 < n; ++wi) {
        s.warps[wi].live = n - wi * 32 < 32 ? n - wi * 32 : 32;
        s.warps[wi].arrived = 0;
    }
    s.live = n;
    s.bar_arrived = 0;
    const int mode = __atomic_load_n(&g_schedule, __ATOMIC_RELAXED);
    for (int i = 0; mode && i < n; ++i) s.order[i] = (short)(mode == 1 ? n - 1 - i : i);
    int done = 0;
    while (done < n) {
        bool ran = false;
        if (mode == 2) {
            for (int i = n - 1; i > 0; --i) {  // Fisher-Yates with xorshift32
                s.rng ^= s.rng << 13;
                s.rng ^= s.rng >> 17;
                s.rng ^= s.rng << 5;
                const int j = (int)(s.rng % (unsigned)(i + 1));
                const short t = s.order[i];
                s.order[i] = s.order[j];
                s.order[j] = t;
            }
        }
        for (int k = 0; k < n; ++k) {
            Fiber* f = &s.fib[mode ? s.order[k] : k];
            if (f->state != S_RUN) continue;
            ran = true;
            resume(f);
            if (f->state == S_DONE) ++done;
        }
        if (!ran) return E_LAUNCH_FAILED;  // deadlock: divergent barriers / collectives
    }
    return s.error;
}

// Run a whole grid; body(closure) is one CUDA thread.
static int run_grid(void (*body)(void*), void* closure, unsigned gx, unsigned gy, unsigned gz,
                    unsigned bx, unsigned by, unsigned bz, unsigned smem) {
    if (!gx || !gy || !gz || !bx || !by || !bz) return E_INVALID_VALUE;
    if (gx > 2147483647u || gy > 65535u || gz > 65535u || bx > 1024u || by > 1024u || bz > 64u)
        return E_INVALID_VALUE;
    const unsigned long long n = (unsigned long long)bx * by * bz;
    if (n > MAX_THREADS || smem > 227u * 1024u) return E_INVALID_VALUE;
    Sched& s = S;
    if (s.active) return E_INVALID_VALUE;  // a kernel cannot launch a kernel here
    if (!ensure_pool((int)n)) return E_OUT_OF_MEMORY;
    s.active = 1;
    s.body = body;
    s.closure = closure;
    s.gdim = dim3{gx, gy, gz};
    s.bdim = dim3{bx, by, bz};
    s.n = (int)n;
    s.error = 0;
    s.rng = __atomic_load_n(&g_seed, __ATOMIC_RELAXED) * 2654435761u + 0x9e3779b9u;
    if (!s.rng) s.rng = 1;
    int rc = 0;
    for (unsigned z = 0; z < gz && !rc; ++z)
        for (unsigned y = 0; y < gy && !rc; ++y)
            for (unsigned x = 0; x < gx && !rc; ++x) {
                s.bid = uint3{x, y, z};
                rc = run_block(s);
            }
    s.cur = nullptr;
    s.active = 0;
    return rc;
}

// ---- trampolines: cuLaunchKernel's kernelParams -> a call of the kernel ----------------------
template <class T> using param_t = typename std::decay<T>::type;

template <class... A, size_t... I>
static int launch_impl(void (*fn)(A...), void** params, std::index_sequence<I...>,
                       unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned smem) {
    constexpr size_t N = sizeof...(A);
    constexpr size_t sizes[N + 1] = {sizeof(param_t<A>)..., 0};
    size_t offs[N + 1];
    size_t total = 0;
    for (size_t i = 0; i < N; ++i) {
        offs[i] = total;
        total += (sizes[i] + 15) & ~(size_t)15;
    }
    alignas(16) unsigned char copy[total ? total : 1];  // values copied at launch, like CUDA
    for (size_t i = 0; i < N; ++i) memcpy(copy + offs[i], params[i], sizes[i]);
    struct Call {
        void (*fn)(A...);
        unsigned char* base;
        const size_t* offs;
        static void run(void* p) {
            Call* c = (Call*)p;
            c->fn(*(param_t<A>*)(c->base + c->offs[I])...);
        }
    } call{fn, copy, offs};
    return run_grid(&Call::run, &call, gx, gy, gz, bx, by, bz, smem);
}

template <class... A>
static int launch(void (*fn)(A...), void** params, unsigned gx, unsigned gy, unsigned gz,
                  unsigned bx, unsigned by, unsigned bz, unsigned smem) {
    return launch_impl(fn, params, std::index_sequence_for<A...>{}, gx, gy, gz, bx, by, bz, smem);
}

template <class... A>
static int param_sizes(void (*)(A...), unsigned long long* sizes, int cap) {
    const unsigned long long s[sizeof...(A) + 1] = {sizeof(param_t<A>)..., 0};
    for (int i = 0; i < (int)sizeof...(A) && i < cap; ++i) sizes[i] = s[i];
    return (int)sizeof...(A);
}

}  // namespace avi_emu

AVI_EMU_EXPORT void avi_emu_set_schedule(int mode, unsigned seed) {
    __atomic_store_n(&avi_emu::g_seed, seed, __ATOMIC_RELAXED);
    __atomic_store_n(&avi_emu::g_schedule, mode, __ATOMIC_RELAXED);
}

// ---- CUDA device functions ----------------------------------------------------------------
inline void __syncthreads() {
    avi_emu::Sched& s = avi_emu::S;
    if (++s.bar_arrived == s.live) {
        avi_emu::release_bar(s);
        return;
    }
    avi_emu::Fiber* me = s.cur;
    me->state = avi_emu::S_BAR;
    avi_emu::yield(me);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// CUDA graph conditionals (docs/cuda_graphs.md): the emulated driver's handle is the address
// of the handle's 32-bit value word (graph_emu.c); the device runtime's builtin stores it.
typedef unsigned long long cudaGraphConditionalHandle;
inline void cudaGraphSetConditional(cudaGraphConditionalHandle h, unsigned int value) {
    __atomic_store_n(reinterpret_cast<unsigned int*>(h), value, __ATOMIC_SEQ_CST);
}
[[noreturn]] inline void __trap() {
    avi_emu::S.error = avi_emu::E_LAUNCH_FAILED;
    avi_emu::fiber_exit();
}

namespace avi_emu {
template <class T>
inline T shfl(int op, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    Fiber* me = S.cur;
    me->op = op;
    me->arg = arg;
    me->width = (width <= 0 || width > 32 || (width & (width - 1))) ? 32 : width;
    me->in[0] = me->in[1] = 0;
    memcpy(me->in, &v, sizeof(T));
    warp_collective(me);
    T r;
    memcpy(&r, me->out, sizeof(T));
    return r;
}
inline unsigned vote(int op, int pred) {
    Fiber* me = S.cur;
    me->op = op;
    me->width = 32;
    me->in[0] = pred != 0;
    warp_collective(me);
    return me->out[0];
}
}  // namespace avi_emu

template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return avi_emu::shfl(avi_emu::W_IDX, v, src, width);
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    return avi_emu::shfl(avi_emu::W_XOR, v, mask, width);
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    return avi_emu::shfl(avi_emu::W_UP, v, (int)d, width);
}
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    return avi_emu::shfl(avi_emu::W_DOWN, v, (int)d, width);
}
inline unsigned __ballot_sync(unsigned, int p) { return avi_emu::vote(avi_emu::W_BALLOT, p); }
inline int __any_sync(unsigned, int p) { return (int)avi_emu::vote(avi_emu::W_ANY, p); }
inline int __all_sync(unsigned, int p) { return (int)avi_emu::vote(avi_emu::W_ALL, p); }
inline void __syncwarp(unsigned = 0xffffffffu) { (void)avi_emu::vote(avi_emu::W_SYNC, 0); }

// TF32 tensor-core helpers of common.cuh (GPU definitions there, under #ifndef AVI_HOST_EMU)
inline unsigned avi_cvt_tf32(float x) {  // cvt.rna.tf32.f32: nearest, ties away from zero
    unsigned u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x00400000u) & 0xffffe000u;  // NaN stays NaN
    return (u + 0x1000u) & 0xffffe000u;  // sign-magnitude: adding half an ulp rounds away
}
inline void avi_mma_tf32_m16n8k8(float d[4], const unsigned a[4], const unsigned b[2]) {
    avi_emu::Fiber* me = avi_emu::S.cur;
    me->op = avi_emu::W_MMA;
    me->width = 32;
    memcpy(me->in, a, 16);
    memcpy(me->in + 4, b, 8);
    memcpy(me->in + 6, d, 16);
    avi_emu::warp_collective(me);
    memcpy(d, me->out, 16);
}

// ---- bit casts and rounded arithmetic (built with -ffp-contract=off: never fused) ---------
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

// CUDA's integer/float min/max overloads
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// atomics: fibers of a block share an OS thread, but two streams may run concurrently
template <class T> inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) {
    float old = *p, nv;
    do { nv = old + v; } while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_SEQ_CST,
                                                           __ATOMIC_SEQ_CST));
    return old;
}
template <class T> inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicCAS(T* p, T cmp, T v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
template <class T> inline T atomicMax(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {}
    return old;
}
template <class T> inline T atomicMin(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {}
    return old;
}
template <class T> inline T __ldg(const T* p) { return *p; }

#endif  // AVI_EMU_PRELUDE_H
// ---- end of the emulator prelude; the CUDA source follows -----------------------------------
