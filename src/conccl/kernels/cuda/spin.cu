// The spin wait: one warp whose thread 0 polls signal words with acquire loads, in place of a
// stream memory wait (conccl/kernels/spin.py says what it costs and why).
// Options: POLL_SLEEP_NS (ns of __nanosleep between polls; 0: none).
#include "conccl.cuh"
#if __CUDA_ARCH__ < 700
#error "conccl's spin wait needs sm_70 (ld.acquire, __nanosleep)"
#endif
#ifndef POLL_SLEEP_NS
#error "conccl's spin wait is compiled with POLL_SLEEP_NS (conccl.kernels.spin)"
#endif

#define WORDS(q) q u32* w0, q u32* w1, q u32* w2, q u32* w3, q u32* w4, q u32* w5, q u32* w6, q u32* w7
#define VALUES u32 v0, u32 v1, u32 v2, u32 v3, u32 v4, u32 v5, u32 v6, u32 v7

// Waits until (int)(*w_i - v_i) >= 0 for every i < n, in order; ends early on the abort word or
// the time bound (then the timed-out word is 1). No fence at the end: what the stream runs next
// (copies, kernels) starts once the kernel has ended and reads the peer's data, released before
// its signal, through this GPU's L2 or NVLink, never this SM's L1; a fence here would order only
// this thread's later accesses, and it has none.
extern "C" __global__ void __launch_bounds__(32) conccl_spin_wait(WORDS(const), VALUES, int n, const u32* abort_word,
                                                                  u64 timeout_ns, u32* timed_out_word) {
    if (threadIdx.x != 0) return;
    const u64 start = globaltimer();
    for (int i = 0; i < n; ++i)
        if (!wait_geq<POLL_SLEEP_NS>(PICK(w, i), PICK(v, i), abort_word, start, timeout_ns, timed_out_word)) return;
}
