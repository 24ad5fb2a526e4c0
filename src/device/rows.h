// Row reductions spread over threads, for device sources: a row of `dim`
// values is cut into kLanes strided lanes (lane l holds the values at
// l, l + kLanes, ...), each lane reduced in index order by one index of the
// 2-D space (row, lane), then the lanes joined in lane order by one index
// per row. Rows of thousands of values keep thousands of threads busy, and
// the order of every sum depends only on dim and kLanes: the same in the
// host and cuda builds, whatever the thread count.
#pragma once

#include <cstdint>

namespace qf::device {

constexpr int64_t kLanes = 32;

}  // namespace qf::device
