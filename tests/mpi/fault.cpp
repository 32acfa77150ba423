// A training loop in which one rank fails, for the fault entries of tests/mpi.cmake:
//   flux_mpi_fault kill    rank 1 kills itself (SIGKILL) at step 3
//   flux_mpi_fault hang    rank 1 stops answering at step 3 (sleeps instead of joining the allreduce)
//   flux_mpi_fault late    rank 1 starts 120 s late (never joins within the timeout)
//   flux_mpi_fault shard-hang   as hang, in sharded training (distributed::shard, stage 2)
//   flux_mpi_fault shard3-hang  as hang, at stage 3 (the first layer's gather in the forward)
// The other ranks must end with a clear error within FLUX_DISTRIBUTED_TIMEOUT, never hang. Each
// rank prints "rank R: ..." lines; an error ends the program with status 1.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "flux/flux.hpp"

using namespace flux;

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  const bool stage3 = !std::strcmp(mode, "shard3-hang");
  const bool sharded = !std::strcmp(mode, "shard-hang") || stage3;
  if (std::strcmp(mode, "kill") && std::strcmp(mode, "hang") && std::strcmp(mode, "late") && !sharded) {
    std::fprintf(stderr, "usage: %s kill|hang|late|shard-hang|shard3-hang\n", argv[0]);
    return 2;
  }
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!std::strcmp(mode, "late") && world_rank && std::atoi(world_rank) == 1)
    std::this_thread::sleep_for(std::chrono::seconds(120));
  int rank = -1;
  try {
    auto comm = distributed::initialize();
    rank = comm.rank();
    std::printf("rank %d: joined %d ranks, timeout %g s\n", rank, comm.size(), comm.timeout());
    std::fflush(stdout);
    auto model = distributed::broadcast(comm, Chain(Dense(8, 32, relu), Dense(32, 1)), 0);
    auto opt = optimisers::setup(optimisers::Adam(1e-3), model);
    auto [sharded_model, sharded_state] = distributed::shard(comm, model, opt, {.stage = stage3 ? 3 : 2});
    Tensor x = randn({16, 8}), y = randn({16, 1});
    for (int step = 0; step < 1000; ++step) {
      if (step == 3 && rank == 1) {
        if (!std::strcmp(mode, "kill")) std::raise(SIGKILL);
        std::this_thread::sleep_for(std::chrono::seconds(120));
      }
      if (sharded) {
        auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return mse(m(x), y); }, sharded_model);
        optimisers::update(sharded_state, sharded_model, grads);
      } else {
        auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return mse(m(x), y); }, model);
        optimisers::update(opt, model, grads);
      }
      if (step < 5) std::printf("rank %d: step %d\n", rank, step);
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
