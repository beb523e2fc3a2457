"""Sol as a CuTe DSL kernel for Hopper (sm_90a): the kept key blocks, and optionally the correction.

Imported only where nvidia-cutlass-dsl is installed (``kernels/sol_cute.py`` decides); importing it
builds nothing, ``SolKeptSm90`` is compiled on first use.

One CTA takes two neighbouring query blocks of 64 rows of one (batch x head) and has three warpgroups
(FlashAttention-3's split of roles, written for Sol's per-query-block key lists):

- warpgroup 0 loads. Its warp c streams, for query block 2 * pid + c, the query tile and then every kept
  key block's K and V tiles (one bulk TMA copy each, swizzled for the tensor cores) into consumer c's own
  ring of ``stages`` shared-memory slots, guarded by mbarriers. It gives back its registers
  (``setmaxnreg``) to the two consumers.
- warpgroups 1 and 2 compute, one query block each, with its own kept list (lists differ between query
  blocks, so the two consumers share no K/V tile and run at their own pace). Per kept block: S = Q K^T
  as a warpgroup MMA (m64n64, float32 accumulators; Q read once into registers with ``q_regs``, else
  from shared memory), the online softmax on the
  accumulators in registers (base-2 exponentials: the scale times log2(e) comes in as ``scale_log2``),
  P converted to bf16 in registers and O += P V as a warpgroup MMA with P from registers. While one
  consumer is in its softmax the other's MMAs keep the tensor cores busy; the loader stays ahead by up
  to ``stages`` blocks.

With ``correction`` the loader then streams the key-block means (hi and lo bf16 parts) and the value
sums, 64 blocks at a time, through the same slots, and the consumers add every rejected block's
approximation to the same online softmax (as the fused Triton kernel does).

Output: O normalised (bf16) and the rows' log-sum-exp in base-2 units (float32). Without the
correction, the Triton correction pass (``kernels/sol_triton.py``, ``init``) can start from this state
(m = lse, l = 1, acc = O).

Keys past the end of the sequence (the last block of a length that is not a multiple of 64) are read
as zeros by TMA and masked to -inf; query rows past the end are not stored.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory as memory
import cutlass.tensor_utils as tensor_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

__all__ = ["SolKeptSm90"]

BLOCK = 64
WG = 128  # threads per warpgroup


class SolKeptSm90:
    """The compiled object: ``cute.compile(SolKeptSm90(d, stages, correction, q_regs), *views, scale, stream)``
    with the views of ``sol_cute._cute_args``."""

    def __init__(self, head_dim: int = 128, stages: int = 3, correction: bool = False, q_regs: bool = True) -> None:
        if head_dim not in (64, 128):
            raise ValueError(f"head_dim must be 64 or 128 for the CuTe kernel, got {head_dim}")
        if stages not in (2, 3):
            raise ValueError(f"stages must be 2 or 3 (the shared memory holds at most 3), got {stages}")
        self.d = head_dim
        self.stages = stages
        self.correction = correction
        self.q_regs = q_regs
        self.tiler_qk = (BLOCK, BLOCK, head_dim)  # M query rows, N keys, K head dim
        self.tiler_pv = (BLOCK, head_dim, BLOCK)  # M query rows, N head dim, K keys

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor,
                 mIdx: cute.Tensor, mNkept: cute.Tensor, mKm: cute.Tensor, mKmLo: cute.Tensor, mVs: cute.Tensor,
                 mKeep: cute.Tensor, scale_log2: cutlass.Float32, stream: cuda.CUstream):
        # mQ, mK, mO: (n, d, bh), d contiguous; mV: (d, n, bh), d contiguous (V read as the MN-major B
        # operand of O = P V); mLse: (n, bh) float32; mIdx: (nkb, nqb, bh) int32, kept blocks first;
        # mNkept: (nqb, bh) int32. For the correction: the key-block means as hi + lo parts mKm, mKmLo
        # (nkb, d, bh), the value sums mVs (d, nkb, bh), the keep flags mKeep (nkb, nqb, bh) int8.
        dtype = mQ.element_type
        # q_regs: Q read once into registers (S = Q K^T then reads only K from shared memory)
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, cutlass.Float32,
            (1, 1, 1), self.tiler_qk[:2],
            warpgroup.OperandSource.RMEM if self.q_regs else warpgroup.OperandSource.SMEM)
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, cutlass.Float32,
            (1, 1, 1), self.tiler_pv[:2], warpgroup.OperandSource.RMEM)
        s = self.stages
        sq_layout = sm90_utils.make_smem_layout_a(tensor_utils.LayoutEnum.from_tensor(mQ), self.tiler_qk, dtype, 2)
        sk_layout = sm90_utils.make_smem_layout_b(tensor_utils.LayoutEnum.from_tensor(mK), self.tiler_qk, dtype, 2 * s)
        sv_layout = sm90_utils.make_smem_layout_b(tensor_utils.LayoutEnum.from_tensor(mV), self.tiler_pv, dtype, 2 * s)
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, gq = cpasync.make_tiled_tma_atom(g2s, mQ, cute.slice_(sq_layout, (None, None, 0)), (BLOCK, self.d))
        tma_k, gk = cpasync.make_tiled_tma_atom(g2s, mK, cute.slice_(sk_layout, (None, None, 0)), (BLOCK, self.d))
        tma_v, gv = cpasync.make_tiled_tma_atom(g2s, mV, cute.slice_(sv_layout, (None, None, 0)), (self.d, BLOCK))
        # the correction streams 64 block means at a time through the same slots as K (hi, then lo) and V
        tma_km, gkm = cpasync.make_tiled_tma_atom(g2s, mKm, cute.slice_(sk_layout, (None, None, 0)), (BLOCK, self.d))
        tma_kml, gkml = cpasync.make_tiled_tma_atom(g2s, mKmLo, cute.slice_(sk_layout, (None, None, 0)),
                                                    (BLOCK, self.d))
        tma_vs, gvs = cpasync.make_tiled_tma_atom(g2s, mVs, cute.slice_(sv_layout, (None, None, 0)), (self.d, BLOCK))
        self.q_bytes = cute.size_in_bytes(dtype, cute.slice_(sq_layout, (None, None, 0)))
        self.kv_bytes = 2 * cute.size_in_bytes(dtype, cute.slice_(sk_layout, (None, None, 0)))

        @cute.struct
        class Storage:
            q_bar: cute.struct.MemRange[cutlass.Int64, 4]  # consumer c: full 2c, empty 2c + 1
            kv_bar: cute.struct.MemRange[cutlass.Int64, 4 * s]  # consumer c: [2 s c, 2 s c + 2 s)
            sq: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sq_layout)], 1024]
            sk: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sk_layout)], 1024]
            sv: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sv_layout)], 1024]

        self.storage = Storage
        nqb = mNkept.shape[0]
        self.kernel(qk_mma, pv_mma, tma_q, gq, tma_k, gk, tma_v, gv, tma_km, gkm, tma_kml, gkml, tma_vs, gvs,
                    mO, mLse, mIdx, mNkept, mKeep, scale_log2, sq_layout, sk_layout, sv_layout).launch(
            grid=[(nqb + 1) // 2, mQ.shape[2], 1], block=[3 * WG, 1, 1], smem=Storage.size_in_bytes(),
            stream=stream)

    def _pipe(self, bar, stages: int, nbytes: int):
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=bar, num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, WG // 32),  # one arrive per warp
            tx_count=nbytes, defer_sync=True)

    def _tma_views(self, atom, smem, gmem, tile):
        """(shared, global) views of one TMA copy: shared (copy mode, slot), global (copy mode, tile row,
        tile column, batch x head)."""
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2),
                                     cute.group_modes(cute.local_tile(gmem, tile, (None, None, None)), 0, 2))

    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, tma_q: cute.CopyAtom, gq: cute.Tensor,
               tma_k: cute.CopyAtom, gk: cute.Tensor, tma_v: cute.CopyAtom, gv: cute.Tensor, tma_km: cute.CopyAtom,
               gkm: cute.Tensor, tma_kml: cute.CopyAtom, gkml: cute.Tensor, tma_vs: cute.CopyAtom, gvs: cute.Tensor,
               mO: cute.Tensor, mLse: cute.Tensor, mIdx: cute.Tensor, mNkept: cute.Tensor, mKeep: cute.Tensor,
               scale_log2: cutlass.Float32, sq_layout: cute.ComposedLayout, sk_layout: cute.ComposedLayout,
               sv_layout: cute.ComposedLayout):
        pid, bh, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        s = self.stages
        st = memory.SmemAllocator().allocate(self.storage)
        q0 = self._pipe(st.q_bar.data_ptr(), 1, self.q_bytes)
        q1 = self._pipe(st.q_bar.data_ptr() + 2, 1, self.q_bytes)
        kv0 = self._pipe(st.kv_bar.data_ptr(), s, self.kv_bytes)
        kv1 = self._pipe(st.kv_bar.data_ptr() + 2 * s, s, self.kv_bytes)
        sq = st.sq.get_tensor(sq_layout.outer, swizzle=sq_layout.inner)
        sk = st.sk.get_tensor(sk_layout.outer, swizzle=sk_layout.inner)
        sv = st.sv.get_tensor(sv_layout.outer, swizzle=sv_layout.inner)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        if warp < 4:
            cute.arch.setmaxregister_decrease(24)
            # TMA views: (copy mode, tile row, tile column, batch x head); K-like tiles are 64 rows x d,
            # V-like tiles d x 64 keys
            kt, vt = (BLOCK, self.d), (self.d, BLOCK)
            tq_s, tq_g = self._tma_views(tma_q, sq, gq, kt)
            tk_s, tk_g = self._tma_views(tma_k, sk, gk, kt)
            tv_s, tv_g = self._tma_views(tma_v, sv, gv, vt)
            _, tkm_g = self._tma_views(tma_km, sk, gkm, kt)
            _, tkml_g = self._tma_views(tma_kml, sk, gkml, kt)
            _, tvs_g = self._tma_views(tma_vs, sv, gvs, vt)
            stats = (tma_km, tkm_g, tma_kml, tkml_g, tma_vs, tvs_g)
            if warp == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                self.load(0, q0, kv0, tma_q, tq_s, tq_g, tma_k, tk_s, tk_g, tma_v, tv_s, tv_g, stats, mIdx, mNkept,
                          mKeep, pid, bh)
            if warp == 1:
                self.load(1, q1, kv1, tma_q, tq_s, tq_g, tma_k, tk_s, tk_g, tma_v, tv_s, tv_g, stats, mIdx, mNkept,
                          mKeep, pid, bh)
        else:
            cute.arch.setmaxregister_increase(240)
            if warp < 8:
                self.consume(0, q0, kv0, qk_mma, pv_mma, sq, sk, sv, mO, mLse, mIdx, mNkept, mKeep, scale_log2, pid, bh)
            else:
                self.consume(1, q1, kv1, qk_mma, pv_mma, sq, sk, sv, mO, mLse, mIdx, mNkept, mKeep, scale_log2, pid, bh)

    @cute.jit
    def load(self, c: cutlass.Constexpr, qpipe, kvpipe, tma_q, tq_s, tq_g, tma_k, tk_s, tk_g, tma_v, tv_s, tv_g, stats,
             mIdx: cute.Tensor, mNkept: cute.Tensor, mKeep: cute.Tensor, pid, bh):
        qb = pid * 2 + c
        if qb < mNkept.shape[0]:
            qprod, _ = qpipe.make_participants()
            kvprod, _ = kvpipe.make_participants()
            h = qprod.acquire_and_advance()
            cute.copy(tma_q, tq_g[(None, qb, 0, bh)], tq_s[(None, c)], tma_bar_ptr=h.barrier)
            kept = mNkept[(qb, bh)]
            for t in cutlass.range(kept, unroll=1):
                j = mIdx[(t, qb, bh)]
                h = kvprod.acquire_and_advance()
                slot = h.index + c * self.stages
                cute.copy(tma_k, tk_g[(None, j, 0, bh)], tk_s[(None, slot)], tma_bar_ptr=h.barrier)
                cute.copy(tma_v, tv_g[(None, 0, j, bh)], tv_s[(None, slot)], tma_bar_ptr=h.barrier)
            if cutlass.const_expr(self.correction):
                # per chunk of 64 block means, two slots: the means' lo part (its V half carries the value
                # sums again: a slot's transaction count is one K and one V tile), then the hi part with
                # the value sums
                tma_km, tkm_g, tma_kml, tkml_g, tma_vs, tvs_g = stats
                for ch in cutlass.range((mKeep.shape[0] + BLOCK - 1) // BLOCK, unroll=1):
                    h = kvprod.acquire_and_advance()
                    slot = h.index + c * self.stages
                    cute.copy(tma_kml, tkml_g[(None, ch, 0, bh)], tk_s[(None, slot)], tma_bar_ptr=h.barrier)
                    cute.copy(tma_vs, tvs_g[(None, 0, ch, bh)], tv_s[(None, slot)], tma_bar_ptr=h.barrier)
                    h = kvprod.acquire_and_advance()
                    slot = h.index + c * self.stages
                    cute.copy(tma_km, tkm_g[(None, ch, 0, bh)], tk_s[(None, slot)], tma_bar_ptr=h.barrier)
                    cute.copy(tma_vs, tvs_g[(None, 0, ch, bh)], tv_s[(None, slot)], tma_bar_ptr=h.barrier)

    @cute.jit
    def qk(self, qk_mma: cute.TiledMma, acc: cute.Tensor, t_q: cute.Tensor, t_k: cute.Tensor, c: cutlass.Constexpr,
           slot, zero: cutlass.Constexpr = True):
        """Issue S (+)= Q K^T of the K tile in ``slot`` into ``acc`` (committed, not waited for). The MMAs
        accumulate (set once, outside the loops: a field set inside a traced region would not reach the
        next one), so with ``zero`` ``acc`` starts from zeros."""
        if cutlass.const_expr(zero):
            acc.fill(0.0)
        cute.nvgpu.warpgroup.fence()
        for kk in cutlass.range_constexpr(cute.size(t_q, mode=[2])):
            if cutlass.const_expr(self.q_regs):
                cute.gemm(qk_mma, acc, t_q[(None, None, kk)], t_k[(None, None, kk, slot)], acc)
            else:
                cute.gemm(qk_mma, acc, t_q[(None, None, kk, c)], t_k[(None, None, kk, slot)], acc)
        cute.nvgpu.warpgroup.commit_group()

    def _softmax(self, acc_s, acc_o, row_max, row_sum, scale_log2, counts=None):
        """Online softmax of one score tile (plain Python: traced inline, its loops unrolled): the rows'
        maxima (across the 4 threads of a row), the rescale of the running sums and of O, exp2 of the
        scores in place. ``counts``: the key count each of the thread's 16 columns stands for (the
        correction's block means), else 1."""
        for r in range(2):
            mx = -cutlass.Float32.inf
            for jj in range(BLOCK // 4):
                mx = cute.arch.fmax(mx, acc_s[jj % 2 + 2 * r + 4 * (jj // 2)])
            mx = cute.arch.warp_reduction_max(mx, threads_in_group=4)
            m_new = cute.arch.fmax(row_max[r], mx * scale_log2)
            alpha = cute.math.exp2(row_max[r] - m_new, fastmath=True)
            row_max[r] = m_new
            part = cutlass.Float32(0.0)
            for jj in range(BLOCK // 4):
                i = jj % 2 + 2 * r + 4 * (jj // 2)
                p = cute.math.exp2(acc_s[i] * scale_log2 - m_new, fastmath=True)
                acc_s[i] = p
                part = part + (p if counts is None else p * counts[jj])
            row_sum[r] = row_sum[r] * alpha + part
            for jj in range(self.d // 4):
                i = jj % 2 + 2 * r + 4 * (jj // 2)
                acc_o[i] = acc_o[i] * alpha

    @cute.jit
    def _mask_tail(self, acc_s: cute.Tensor, j, n, col0):
        """Keys of block ``j`` past the end of the sequence (TMA read them as zeros) to -inf."""
        valid = n - j * BLOCK
        if valid < BLOCK:
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                if col0 + i % 2 + 8 * (i // 4) >= valid:
                    acc_s[i] = -cutlass.Float32.inf

    def _pv(self, pv_mma, acc_o, r_p, t_v, slot):
        """Issue O += P V of the V tile in ``slot`` (committed, not waited for)."""
        cute.nvgpu.warpgroup.fence()
        for kk in range(cute.size(r_p, mode=[2])):
            cute.gemm(pv_mma, acc_o, r_p[(None, None, kk)], t_v[(None, None, kk, slot)], acc_o)
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def consume(self, c: cutlass.Constexpr, qpipe, kvpipe, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma,
                sq: cute.Tensor, sk: cute.Tensor, sv: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor,
                mIdx: cute.Tensor, mNkept: cute.Tensor, mKeep: cute.Tensor, scale_log2: cutlass.Float32, pid, bh):
        qb = pid * 2 + c
        if qb < mNkept.shape[0]:
            tid = cute.arch.thread_idx()[0] % WG
            lane = tid % 32
            n = mO.shape[0]
            s = self.stages
            _, qcons = qpipe.make_participants()
            thr_qk = qk_mma.get_slice(tid)
            thr_pv = pv_mma.get_slice(tid)
            if cutlass.const_expr(self.q_regs):
                s_q = thr_qk.partition_A(sq)[(None, None, None, c)]  # (MMA, 1, d / 16): this consumer's Q
                t_q = thr_qk.make_fragment_A(s_q)  # registers
            else:
                t_q = thr_qk.make_fragment_A(thr_qk.partition_A(sq))  # (MMA, 1, d / 16, 2): descriptors
            t_k = thr_qk.make_fragment_B(thr_qk.partition_B(sk))  # (MMA, 1, d / 16, 2 s)
            t_v = thr_pv.make_fragment_B(thr_pv.partition_B(sv))  # (MMA, d / N, 4, 2 s)
            acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((BLOCK, BLOCK)))
            acc_o = thr_pv.make_fragment_C(thr_pv.partition_shape_C((BLOCK, self.d)))
            acc_o.fill(0.0)
            qk_mma.set(warpgroup.Field.ACCUMULATE, True)
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            r_p = cute.make_rmem_tensor(thr_pv.partition_shape_A((BLOCK, BLOCK)), mO.element_type)
            # the accumulator of S and the A fragment of P hold the same (row, key) in the same register
            # order (WGMMA's m64nNk16 layouts), so P is S converted in place through this view
            r_p_as_s = cute.make_tensor(r_p.iterator, acc_s.layout)
            row_max = cute.make_rmem_tensor((2,), cutlass.Float32)
            row_sum = cute.make_rmem_tensor((2,), cutlass.Float32)
            row_max.fill(-cutlass.Float32.inf)
            row_sum.fill(0.0)
            qcons.wait_and_advance()
            if cutlass.const_expr(self.q_regs):
                cute.autovec_copy(s_q, t_q)
            kept = mNkept[(qb, bh)]
            # accumulator value i of a thread: row lane / 4 + 8 * ((i / 2) % 2) of its warp's 16,
            # column 2 * (lane % 4) + i % 2 + 8 * (i / 4)
            col0 = 2 * (lane % 4)
            # ``done``: the ring slot being consumed; ``read``: the next one waited for (one ahead while
            # the next block's S = Q K^T is in flight)
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, s)
            done = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, s)
            # every query block keeps at least its own block (the neighbours rule): kept >= 1
            kvpipe.consumer_wait(read)
            self.qk(qk_mma, acc_s, t_q, t_k, c, read.index + c * s)
            read.advance()
            cute.nvgpu.warpgroup.wait_group(0)
            # kept blocks but the last: this block's P V and the next block's S = Q K^T go to the tensor
            # cores back to back (S's accumulator is free once P is converted), one wait for both
            for t in cutlass.range(kept - 1, unroll=1):
                slot = done.index + c * s
                self._mask_tail(acc_s, mIdx[(t, qb, bh)], n, col0)
                self._softmax(acc_s, acc_o, row_max, row_sum, scale_log2)
                r_p_as_s.store(acc_s.load().to(mO.element_type))
                self._pv(pv_mma, acc_o, r_p, t_v, slot)
                kvpipe.consumer_wait(read)
                self.qk(qk_mma, acc_s, t_q, t_k, c, read.index + c * s)
                read.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                kvpipe.consumer_release(done)
                done.advance()
            self._mask_tail(acc_s, mIdx[(kept - 1, qb, bh)], n, col0)
            self._softmax(acc_s, acc_o, row_max, row_sum, scale_log2)
            r_p_as_s.store(acc_s.load().to(mO.element_type))
            self._pv(pv_mma, acc_o, r_p, t_v, done.index + c * s)
            cute.nvgpu.warpgroup.wait_group(0)
            kvpipe.consumer_release(done)
            done.advance()
            if cutlass.const_expr(self.correction):
                # every rejected block j adds count_j exp(q . kmean_j) to the row's sum and exp(q . kmean_j)
                # vsum_j to its output, in the same online softmax (the fused Triton kernel's correction).
                # Per chunk of 64 block means two slots arrive: the means' lo part, then the hi part with
                # the value sums; both score products are issued before one wait.
                nkb = mKeep.shape[0]
                for ch in cutlass.range((nkb + BLOCK - 1) // BLOCK, unroll=1):
                    # this thread's 16 block columns: rejected flags and key counts, loaded before the MMAs
                    rejected = []
                    counts = []
                    for jj in cutlass.range_constexpr(BLOCK // 4):
                        jb = ch * BLOCK + col0 + jj % 2 + 8 * (jj // 2)
                        flag = cutlass.Int32(0)
                        if jb < nkb:
                            flag = cutlass.Int32(mKeep[(jb, qb, bh)] == 0)
                        rejected.append(flag)
                        counts.append(cutlass.Float32(cute.arch.fmin(cutlass.Float32(BLOCK),
                                                                     cutlass.Float32(n - jb * BLOCK))))
                    kvpipe.consumer_wait(done)  # the lo part (``read`` == ``done`` here)
                    self.qk(qk_mma, acc_s, t_q, t_k, c, done.index + c * s)
                    read.advance()
                    kvpipe.consumer_wait(read)  # the hi part and the value sums
                    slot = read.index + c * s
                    self.qk(qk_mma, acc_s, t_q, t_k, c, slot, zero=False)
                    cute.nvgpu.warpgroup.wait_group(0)
                    kvpipe.consumer_release(done)
                    done.advance()
                    for i in cutlass.range_constexpr(cute.size(acc_s)):
                        if rejected[i % 2 + 2 * (i // 4)] == 0:
                            acc_s[i] = -cutlass.Float32.inf
                    self._softmax(acc_s, acc_o, row_max, row_sum, scale_log2, counts)
                    r_p_as_s.store(acc_s.load().to(mO.element_type))
                    self._pv(pv_mma, acc_o, r_p, t_v, slot)
                    cute.nvgpu.warpgroup.wait_group(0)
                    kvpipe.consumer_release(done)
                    done.advance()
                    read.advance()
            # epilogue: O / l in the output dtype, and the base-2 log-sum-exp
            row0 = qb * BLOCK + (tid // 32) * 16 + lane // 4
            for r in cutlass.range_constexpr(2):
                total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
                inv = cute.arch.rcp_approx(total)
                row = row0 + 8 * r
                if row < n:
                    for jj in cutlass.range_constexpr(self.d // 4):
                        i = jj % 2 + 2 * r + 4 * (jj // 2)
                        mO[(row, col0 + jj % 2 + 8 * (jj // 2), bh)] = (acc_o[i] * inv).to(mO.element_type)
                    if lane % 4 == 0:
                        mLse[(row, bh)] = row_max[r] + cute.math.log2(total, fastmath=True)
