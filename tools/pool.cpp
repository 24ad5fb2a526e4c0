// Shared by the commands that take --threads.
#include "commands.h"
#include "core/error.h"

namespace qf::cli {

ThreadPool& pool_for(int threads, std::unique_ptr<ThreadPool>& holder) {
  if (threads < 0) throw Error(ErrorKind::Usage, "--threads must be >= 0");
  if (threads == 0) return ThreadPool::global();
  holder = std::make_unique<ThreadPool>(threads);
  return *holder;
}

}  // namespace qf::cli
