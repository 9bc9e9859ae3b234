#!/usr/bin/env bash
# One device call: versions, config timings, GPU tests, and the bench table for problem 77.
# Run from the repository root on the GPU machine: bash benchmarks/gpu_session.sh [steps...]
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/convt3d-out}; mkdir -p "$OUT"
steps=${*:-"env tune tests bench"}
for step in $steps; do
  case $step in
    # Stops the call unless its GPU is an H200 (issue 3's criteria are the H200's; a call for one may get an H100).
    # (The name taken first: under pipefail, grep -q's early exit could fail the pipeline on an H200.)
    h200) gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
          [[ $gpu == *H200* ]] || { echo "not an H200 (${gpu:-no GPU}): stopping"; exit 3; } ;;
    env) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
         python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" ;;
    tune) python3 benchmarks/diag_p77.py --only configs 2>&1 | tee "$OUT/tune.log" ;;
    phases) python3 benchmarks/diag_phases.py --iters 20 2>&1 | tee "$OUT/phases.log" ;;
    profile) python3 benchmarks/profile_fwdbwd.py --calls 20 2>&1 | tee "$OUT/profile.log" ;;
    streams) python3 benchmarks/diag_streams.py 2>&1 | tee "$OUT/streams.log" ;;
    trace) python3 benchmarks/trace_fwdbwd.py --calls 10 --only forward+backward 2>&1 | tee "$OUT/trace.log" ;;
    host) python3 benchmarks/diag_host.py 2>&1 | tee "$OUT/host.log" ;;
    auto) python3 benchmarks/diag_auto.py batch1_small_k3s2 wide_256to128_k3s2 unet3d_k2s2_deep 2>&1 | tee "$OUT/auto.log" ;;
    # (-n 4: about 230 s on the H200 in the sixty-ninth session; pytest-xdist is installed there)
    # (the whole log kept: its last 40 lines alone once left two failures unnamed)
    tests) PYTHONPATH=$PWD/src:$PWD/tests python3 -m pytest -p no:warnings -n 4 -rfs tests/test_gpu.py \
               tests/test_triton_backward.py tests/test_cuda_kernel_cache.py tests/test_environment.py \
               tests/test_triton_turned.py > "$OUT/pytest.log" 2>&1
           tail -40 "$OUT/pytest.log" ;;
    bench) python3 -m convt3d bench --json "$OUT/p77.json" --plot "$OUT/p77.png" 2>&1 | tee "$OUT/bench.log" ;;
    backward) python3 -m convt3d bench --backward --no-compile --json "$OUT/p77_backward.json" 2>&1 | tee "$OUT/backward.log" ;;
    sweep) python3 -m convt3d bench --sweep --no-compile --iters 30 --json "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log" ;;
    # A prepared call's ways of launching (Triton's launcher or the driver, operands' buffers allocated or kept) in one
    # process, then the host steps.
    ways) python3 benchmarks/diag_launch_ways.py --rounds 3 2>&1 | tee "$OUT/ways.log"
          python3 benchmarks/diag_host_steps.py --calls 300 --layers batch1_small_k3s2,video_k3s2p1op1 --profile-top 8 \
              2>&1 | tee "$OUT/host_steps.log" ;;
    # Problem 77's operand pass: beside the fill in one launch (tried in the sixty-seventh and sixty-eighth sessions),
    # and left out by a correlation that reads the input itself (the library's since the sixty-eighth session: direct).
    p77_pass) python3 benchmarks/diag_fused_fill.py --iters 100 --rounds 2 2>&1 | tee "$OUT/fused_fill.log"
              python3 benchmarks/diag_window_free.py --iters 100 --rounds 2 2>&1 | tee "$OUT/window_free.log" ;;
    direct) python3 benchmarks/diag_direct_input.py --iters 100 --rounds 3 2>&1 | tee "$OUT/direct_input.log"
            python3 benchmarks/diag_pass_maxima.py --iters 100 --rounds 2 2>&1 | tee "$OUT/pass_maxima.log" ;;
    # Problem 77's correlation at four programs a multiprocessor, and the fill leaving the lattice rows to it (sixty-
    # ninth session: neither faster).
    p77_layout) python3 benchmarks/diag_programs_per_sm.py --iters 100 --rounds 3 2>&1 | tee "$OUT/programs.log"
                python3 benchmarks/diag_gap_fill.py --iters 100 --rounds 2 2>&1 | tee "$OUT/gap_fill.log" ;;
    # Problem 77's correlation with the weights kept and the planes in rings (prepared in the sixty-ninth session, not
    # run).
    ring) python3 benchmarks/diag_depth_ring.py --iters 100 --rounds 2 2>&1 | tee "$OUT/depth_ring.log" ;;
    # Does the L2 merge the correlation's half-written lattice sectors with zeros it still holds (timed, then the
    # DRAM bytes at batch 1 under Nsight Compute), and problem 77's forward with each correlation program filling its
    # share of its sample just before its lattice writes (prepared in the seventieth session, not run).
    l2merge) python3 benchmarks/diag_l2_merge.py --iters 100 2>&1 | tee "$OUT/l2_merge.log"
             ncu --cache-control none --clock-control none -k regex:phase_conv_rows --metrics \
                 dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
                 python3 benchmarks/diag_l2_merge.py --profile 1 2>&1 | tee "$OUT/l2_merge_ncu.log" ;;
    sample_fill) python3 benchmarks/diag_sample_fill.py --iters 100 --rounds 2 2>&1 | tee "$OUT/sample_fill.log" ;;
    # A layer's first call in a fresh process: the kernels it compiles and their time; problem 77 with and without the
    # check's compile of before the seventieth session, a k3 s2 layer with its eight kernels compiled side by side or
    # one at a time (prepared then, not run).
    compile) python3 benchmarks/diag_compile_time.py --rounds 1 2>&1 | tee "$OUT/compile_time.log" ;;
    # Why problem 77's correlation waits: every sampled stall reason of row_runs.py's kernel, TF32 mode (FP16, reading
    # the input) and TF32 off (3xFP16), under Nsight Compute (prepared in the sixty-ninth session, not run: the
    # machine stopped answering).
    stalls) for mode in "" --tf32-off; do
              ncu --clock-control none -k regex:phase_conv_rows --launch-skip 3 --launch-count 1 --metrics \
                  'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio',smsp__issue_active.avg.pct_of_peak_sustained_active \
                  python3 benchmarks/profile_layer.py kernelbench_l1_77_dilated torch $mode 2>&1 | tee "$OUT/stalls$mode.log"
            done ;;
    # Problem 77's correlation copying the next input plane into shared memory during the MMAs (seventy-third
    # session).
    prefetch) python3 benchmarks/diag_plane_prefetch.py --iters 100 --rounds 3 2>&1 | tee "$OUT/prefetch.log" ;;
    # Problem 77's forward with no fill: each correlation program fills the output around its own lattice tile while
    # it computes (cuda.REGION_FILL, by default by a fill warpgroup with TF32 off and, where it serves, in TF32 mode;
    # and variants of it: seventy-sixth to eightieth sessions, benchmarks/RESULTS.md); the GPU tests and the bench with
    # it on in both modes; the correlations' DRAM bytes under Nsight Compute.
    region_fill) python3 benchmarks/diag_region_fill.py --iters 100 --rounds ${ROUNDS:-2} 2>&1 | tee "$OUT/region_fill.log" ;;
    # The fill-warpgroup kernel taken apart (what-ifs: no fill, the fill alone, no tile write) and persistent programs
    # (eighty-first and eighty-second sessions: every other form of the fill slower, but its loop unrolled by 4 in
    # FP16, the library's since); the lattice plane written whole from the staged tile (eighty-fourth session, H100:
    # faster in FP16, slower in 3xFP16; eighty-seventh, H200: slower in both). FORMS: words, only the forms whose names
    # hold one (and the library's): FORMS="both channels fill tile", the lattice plane's forms and the what-ifs.
    fused_parts) PYTHONPATH=$PWD/src:$PWD/tests:$PWD/benchmarks python3 benchmarks/diag_fused_parts.py --iters 100 \
                     --rounds ${ROUNDS:-2} ${FORMS:+--forms $FORMS} 2>&1 | tee "$OUT/fused_parts.log" ;;
    # The region fill's runs ending at sectors' edges (ninety-first session, H100: problem 77's forward about 4% less in
    # TF32 mode): problem 77's bench without and with them, in alternating processes, two rounds.
    sector_edges) for round in 1 2; do
                    for edges in 0 1; do
                      CONVT3D_SECTOR_EDGES=$edges python3 -m convt3d bench --no-compile \
                          --json "$OUT/p77_sector_edges${edges}_round$round.json" 2>&1 \
                          | tee "$OUT/p77_sector_edges${edges}_round$round.log" | grep -E "^(convt3d|floor: write)"
                    done
                  done ;;
    region_fill_tests) CONVT3D_REGION_FILL=1 PYTHONPATH=$PWD/src:$PWD/tests python3 -m pytest -p no:warnings -n 4 -rfs \
                           tests/test_gpu.py > "$OUT/pytest_region_fill.log" 2>&1
                       tail -40 "$OUT/pytest_region_fill.log" ;;
    region_fill_bench) CONVT3D_REGION_FILL=1 python3 -m convt3d bench --no-compile --json "$OUT/p77_region_fill.json" \
                           2>&1 | tee "$OUT/bench_region_fill.log" ;;
    # Why the region fill's stores run at half the DRAM's rate: the region kernel's memory, speed-of-light and warp
    # state sections, TF32 mode (FP16) and TF32 off (3xFP16), the fill on in both (seventy-seventh session).
    region_fill_stalls) for mode in "" --tf32-off; do
                          CONVT3D_REGION_FILL=1 ncu --clock-control none -k regex:phase_conv_rows --launch-skip 3 \
                              --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
                              --section WarpStateStats --section Occupancy \
                              python3 benchmarks/profile_layer.py kernelbench_l1_77_dilated torch $mode 2>&1 \
                              | tee "$OUT/region_fill_stalls$mode.log"
                        done ;;
    # Problem 77's output filled by programs that only fill, in the region fill's pattern and others, beside zero_()
    # (seventy-ninth session: the pattern held the fill at 78% of zero_()'s rate on an H100).
    region_pattern) python3 benchmarks/diag_region_pattern.py --iters 100 --rounds 2 2>&1 | tee "$OUT/region_pattern.log" ;;
    region_fill_ncu) ncu --clock-control none -k regex:phase_conv_rows --metrics \
                         dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
                         python3 benchmarks/diag_region_fill.py --profile 2>&1 | tee "$OUT/region_fill_ncu.log" ;;
  esac
done
