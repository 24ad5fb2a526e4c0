// qwen2_5_vl_windows: Qwen2.5-VL's window partition of the merged grid.
//
// transformers pads each frame's merged grid with empty units up to the next
// multiple of the window side (a whole extra window when the side already
// divides: its pad is window - side % window), cuts it into windows, lists
// the real units window by window and records each window's size; windows
// left empty by the padding repeat the previous bound, which
// unique_consecutive then removes. Units are counted across frames (frame t's
// unit i is t * units_per_frame + i) and bounds in patch rows (merge^2 per unit).
#include "runtime/vision/qwen2_vl_vision.h"

#include <algorithm>

#include "core/error.h"

namespace qf::rt {

VisionWindows qwen2_5_vl_windows(int64_t grid_t, int64_t grid_h, int64_t grid_w, int64_t merge, int64_t window_units) {
  if (window_units < 1 || merge < 1 || grid_h % merge != 0 || grid_w % merge != 0)
    throw Error(ErrorKind::Internal, "qwen2_5_vl_windows: bad grid or window");
  const int64_t lh = grid_h / merge, lw = grid_w / merge, vw = window_units;
  const int64_t windows_h = (lh + vw - lh % vw) / vw, windows_w = (lw + vw - lw % vw) / vw;
  VisionWindows w;
  w.segments.push_back(0);
  for (int64_t t = 0; t < grid_t; ++t)
    for (int64_t wh = 0; wh < windows_h; ++wh)
      for (int64_t ww = 0; ww < windows_w; ++ww) {
        int64_t count = 0;
        for (int64_t y = wh * vw; y < std::min(lh, (wh + 1) * vw); ++y)
          for (int64_t x = ww * vw; x < std::min(lw, (ww + 1) * vw); ++x, ++count)
            w.order.push_back((t * lh + y) * lw + x);
        if (count > 0) w.segments.push_back(w.segments.back() + count * merge * merge);
      }
  return w;
}

}  // namespace qf::rt
