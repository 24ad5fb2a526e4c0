#!/usr/bin/env bash
# The test command (CI runs it through .ci/run): installs dependencies, builds
# (Release, -j2) and runs every test with ctest at the CPU's best SIMD level;
# then runs the unit tests twice more, with QF_SIMD=avx2 and with
# QF_SIMD=scalar, so the model, quantizer and calibration tests also run on the
# AVX2 and on the scalar kernels (docs/runtime.md, "The SIMD switch").
# Tests that need ../shared skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
jobs="${QF_JOBS:-2}"
# OpenMP threads (the device code's host build) wait passively: spinning
# ones starve the other test that ctest -j runs beside them (CMakeLists.txt).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

echo "== all tests at the CPU's best SIMD level (QF_SIMD unset)"
env -u QF_SIMD ctest --test-dir build --output-on-failure -j "$jobs"

# The extra passes leave out what runs once above: the end-to-end CLI tests,
# the tests that iterate over the SIMD levels themselves, and the long
# end-to-end ones (quantizing, calibrating or evaluating the fixture over many
# windows, the stories260K goldens, the fused-scale exports quantized and
# loaded as vLLM does, the size-budget searches over the fixture, the Python
# module's pytest suite and notebook), which
# take minutes at the scalar level.
# What is left (about 400 tests) takes under a minute per pass on 2 cores.
skip='^cli\.|^python\.'
skip+='|^Quantize\.|^Schemes\.|^Smoothing\.(Awq|SmoothQuant)|^FusedScales\.|^MixedGguf\.'
skip+='|^FixtureGguf\.(KlDivergenceGrowsAsBitsShrink|ImatrixImprovesLowBitPresets)'
skip+='|^Fixture\.LogitsAtEverySimdLevelWithinReferenceBound|^Models/TrainedFixture\.PerplexityMatchesTrainingReport'
skip+='|^Stories\.|^HfToGguf\.Stories260K'

# The avx2 level needs AVX2, FMA and F16C (core/simd.cpp); without them
# QF_SIMD=avx2 would run the scalar kernels, which the next pass does anyway.
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has_flag() { [[ " $cpu_flags " == *" $1 "* ]]; }

for level in avx2 scalar; do
  if [[ $level == avx2 ]] && ! { has_flag avx2 && has_flag fma && has_flag f16c; }; then
    echo "== unit tests at QF_SIMD=avx2: skipped, this CPU lacks AVX2/FMA/F16C (the scalar pass follows)"
    continue
  fi
  echo "== unit tests at QF_SIMD=$level"
  start=$SECONDS
  QF_SIMD=$level ctest --test-dir build --output-on-failure -j "$jobs" -E "$skip"
  echo "== unit tests at QF_SIMD=$level: passed in $((SECONDS - start)) s"
done
