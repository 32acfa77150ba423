// Sharded training (distributed/shard.hpp) under mpirun: tests/mpi.cmake runs this binary at np 2, 3
// and 4 (oversubscribed) and without mpirun. Every rank runs every test in the same order (the tests
// are collective). Each rank also trains the one-process reference itself, on the concatenated
// batches, and the sharded run must match it: losses and parameters to float32 rounding after 20
// steps. The checkpoint entries: the np 4 run saves FLUX_SHARD_CHECKPOINT, later entries (np 2,
// without mpirun) load it and continue.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

#include <gmock/gmock.h>

#include "flux/distributed/shard.hpp"
#include "src/storage_stats.hpp"
#include "test_devices.hpp"

using namespace flux;
using flux::testing::error_of;
using flux::testing::test_devices;

namespace {

distributed::Communicator world() { return distributed::initialize(); }

using Model = Chain<Dense, Dense, Dense>;

Model make_model(const Device& dev, uint64_t seed_value) {
  seed(seed_value);
  // 6 -> 10 -> 7 -> 3: arrays of 60, 10, 70, 7, 21 and 3 elements, so that at np 3 and 4 most arrays
  // leave padding in the last chunk and the last bias (3 elements) leaves rank 3 of 4 nothing.
  return Chain(Dense(6, 10, tanh_act), Dense(10, 7, relu), Dense(7, 3)) | dev;
}

std::shared_ptr<optimisers::Rule> make_rule(const std::string& kind) {
  if (kind == "Adam") return std::make_shared<optimisers::Adam>(0.02);
  if (kind == "AdamW") return std::make_shared<optimisers::AdamW>(optimisers::AdamWOptions{.eta = 0.02, .lambda = 0.1});
  if (kind == "ClipNormAdam")  // omega small enough that every step clips
    return std::make_shared<optimisers::OptimiserChain>(optimisers::ClipNorm(0.05), optimisers::Adam(0.02));
  return std::make_shared<optimisers::Descent>(0.1);
}

double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<double> x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k) worst = std::max(worst, std::abs(x[k] - y[k]));
  }
  return worst;
}

double mean_over_ranks(const distributed::Communicator& comm, const Tensor& loss) {
  return distributed::allreduce(comm, to(loss.f64(), Device()), distributed::ReduceOp::mean).item<double>();
}

// Data of `steps` batches of b rows per rank.
struct Data {
  Tensor X, Y;
};
Data make_data(int64_t rows) {
  seed(11);
  return {randn({rows, 6}), randn({rows, 3})};
}

auto loss_of(const Tensor& x, const Tensor& y) {
  return [x, y](auto& m) { return mse(m(x), y); };
}

// The one-process reference: `steps` steps on batches of b * p rows; its loss per step.
std::vector<double> reference_run(Model& model, optimisers::State& opt, const Data& d, int64_t from_row, int64_t rows,
                                  int64_t steps, const Device& dev, bool schedule) {
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    Tensor x = to(d.X.slice(from_row + s * rows, from_row + (s + 1) * rows), dev);
    Tensor y = to(d.Y.slice(from_row + s * rows, from_row + (s + 1) * rows), dev);
    if (schedule) optimisers::adjust(opt, 0.02 / (1.0 + 0.1 * double(opt.steps)));
    auto [loss, grads] = withgradient(loss_of(x, y), model);
    optimisers::update(opt, model, grads);
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// `steps` sharded steps, rank r on rows [from + s b p + r b, ... + b) of step s.
std::vector<double> sharded_run(const distributed::Communicator& comm, distributed::Sharded<Model>& model,
                                distributed::ShardedState& state, const Data& d, int64_t from_row, int64_t b, int64_t steps,
                                const Device& dev, bool schedule, distributed::GradientOptions go = {}) {
  const int64_t p = comm.size();
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t at = from_row + s * b * p + comm.rank() * b;
    Tensor x = to(d.X.slice(at, at + b), dev), y = to(d.Y.slice(at, at + b), dev);
    if (schedule) optimisers::adjust(state, 0.02 / (1.0 + 0.1 * double(state.steps())));
    auto [loss, grads] = distributed::withgradient(comm, loss_of(x, y), model, go);
    optimisers::update(state, model, grads);
    losses.push_back(mean_over_ranks(comm, loss));
  }
  return losses;
}

std::string clean(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

}  // namespace

// ---- parity: every stage, rule and device against one process, 20 steps ----
struct ShardCase {
  int stage;
  std::string rule;
  bool schedule;
};
class ShardParity : public ::testing::TestWithParam<std::tuple<Device, ShardCase>> {};
INSTANTIATE_TEST_SUITE_P(
    Stages, ShardParity,
    ::testing::Combine(::testing::ValuesIn(test_devices()),
                       ::testing::Values(ShardCase{1, "Adam", false}, ShardCase{2, "Adam", false}, ShardCase{3, "Adam", false},
                                         ShardCase{1, "AdamW", true}, ShardCase{2, "AdamW", true}, ShardCase{3, "AdamW", true},
                                         ShardCase{1, "ClipNormAdam", false}, ShardCase{2, "ClipNormAdam", true},
                                         ShardCase{3, "ClipNormAdam", true})),
    [](const auto& info) {
      const ShardCase& c = std::get<1>(info.param);
      return clean(to_string(std::get<0>(info.param)) + "_stage" + std::to_string(c.stage) + "_" + c.rule +
                   (c.schedule ? "_schedule" : ""));
    });

TEST_P(ShardParity, TwentyStepsMatchOneProcess) {
  auto comm = world();
  const Device dev = std::get<0>(GetParam());
  const ShardCase sc = std::get<1>(GetParam());
  const int64_t b = 3, steps = 20, p = comm.size();
  Data d = make_data(steps * b * p);
  Model reference = make_model(dev, 3);
  auto opt_ref = optimisers::setup(*make_rule(sc.rule), reference);
  std::vector<double> want = reference_run(reference, opt_ref, d, 0, b * p, steps, dev, sc.schedule);

  Model start = distributed::broadcast(comm, make_model(dev, 3), 0);
  // bucket_bytes 160: several buckets, the first array alone in one
  auto [model, state] = distributed::shard(comm, start, optimisers::setup(*make_rule(sc.rule), start),
                                           {.stage = sc.stage, .bucket_bytes = 160});
  // stages 1 and 2: a float32 array whose chunk needs no padding is stepped in place (its master is a
  // view of the model's own memory, no copy); the others (and every array at stage 3) have copies
  const std::vector<Tensor> arrays = params(model.model);
  for (size_t i = 0; i < state.masters.size(); ++i) {
    const Tensor& whole = arrays[i];
    const bool full_chunk = (comm.rank() + 1) * state.masters[i].numel() <= whole.numel();
    EXPECT_EQ(state.masters[i].impl()->storage == whole.impl()->storage, sc.stage < 3 && full_chunk) << "array " << i;
  }
  std::vector<double> got = sharded_run(comm, model, state, d, 0, b, steps, dev, sc.schedule);
  for (int64_t s = 0; s < steps; ++s) EXPECT_NEAR(got[size_t(s)], want[size_t(s)], 2e-6 * (1 + std::abs(want[size_t(s)]))) << "step " << s;
  const double worst = max_abs_diff(params(distributed::gather_model(model)), params(reference));
  EXPECT_LT(worst, 2e-5) << "parameters after 20 steps";
  EXPECT_EQ(state.steps(), steps);
  // this rank holds 1/p of the optimiser state (each array padded to a multiple of p)
  int64_t mine = 0, whole = 0;
  for (size_t i = 0; i < state.masters.size(); ++i) {
    mine += state.masters[i].numel();
    whole += params(reference)[i].numel();
  }
  EXPECT_LE(mine, whole / p + int64_t(state.masters.size()));
  RecordProperty("worst_parameter_difference", std::to_string(worst));
}

// bf16 on the wire: the gradients are rounded to bf16 before the sum (in float32), so the run follows
// the reference to bf16's precision, not float32's.
TEST_P(ShardParity, Bf16WireFollowsOneProcess) {
  const ShardCase sc = std::get<1>(GetParam());
  if (sc.rule != "Adam") GTEST_SKIP() << "one rule is enough";
  auto comm = world();
  const Device dev = std::get<0>(GetParam());
  const int64_t b = 3, steps = 10, p = comm.size();
  Data d = make_data(steps * b * p);
  Model reference = make_model(dev, 3);
  auto opt_ref = optimisers::setup(optimisers::Adam(0.02), reference);
  std::vector<double> want = reference_run(reference, opt_ref, d, 0, b * p, steps, dev, false);
  Model start = distributed::broadcast(comm, make_model(dev, 3), 0);
  auto [model, state] = distributed::shard(comm, start, optimisers::setup(optimisers::Adam(0.02), start),
                                           {.stage = sc.stage, .bucket_bytes = 160, .wire = DType::bf16});
  std::vector<double> got = sharded_run(comm, model, state, d, 0, b, steps, dev, false);
  for (int64_t s = 0; s < steps; ++s) EXPECT_NEAR(got[size_t(s)], want[size_t(s)], 1e-2 * (1 + std::abs(want[size_t(s)]))) << "step " << s;
  EXPECT_LT(max_abs_diff(params(distributed::gather_model(model)), params(reference)), 2e-2);
}

// bf16 autocast: float32 model and masters, matmuls in bf16; against one process under autocast.
TEST_P(ShardParity, AutocastBf16FollowsOneProcess) {
  const ShardCase sc = std::get<1>(GetParam());
  if (sc.rule != "Adam") GTEST_SKIP() << "one rule is enough";
  auto comm = world();
  const Device dev = std::get<0>(GetParam());
  const int64_t b = 3, steps = 10, p = comm.size();
  Data d = make_data(steps * b * p);
  Model reference = make_model(dev, 3);
  auto opt_ref = optimisers::setup(optimisers::Adam(0.02), reference);
  for (int64_t s = 0; s < steps; ++s) {
    Tensor x = to(d.X.slice(s * b * p, (s + 1) * b * p), dev), y = to(d.Y.slice(s * b * p, (s + 1) * b * p), dev);
    auto [loss, grads] = withgradient(loss_of(x, y), reference, {.autocast = DType::bf16});
    optimisers::update(opt_ref, reference, grads);
  }
  Model start = distributed::broadcast(comm, make_model(dev, 3), 0);
  auto [model, state] = distributed::shard(comm, start, optimisers::setup(optimisers::Adam(0.02), start), {.stage = sc.stage});
  sharded_run(comm, model, state, d, 0, b, steps, dev, false, {.autocast = DType::bf16});
  for (const Tensor& m : state.masters) EXPECT_EQ(m.dtype(), DType::f32);
  EXPECT_LT(max_abs_diff(params(distributed::gather_model(model)), params(reference)), 2e-2);
}

// A bf16 model: float32 masters sharded, the model's arrays are the masters rounded to bf16; the run
// follows a float32 one to bf16's precision.
TEST_P(ShardParity, Bf16ModelKeepsFloat32Masters) {
  const ShardCase sc = std::get<1>(GetParam());
  if (sc.rule != "AdamW") GTEST_SKIP() << "one rule is enough";
  auto comm = world();
  const Device dev = std::get<0>(GetParam());
  const int64_t b = 3, steps = 5, p = comm.size();
  Data d = make_data(steps * b * p);
  Model start = bf16(distributed::broadcast(comm, make_model(dev, 3), 0));
  auto [model, state] = distributed::shard(comm, start, *make_rule(sc.rule), {.stage = sc.stage});
  // The reference: one process, the same bf16 model and float32 masters (a one-rank communicator),
  // on the concatenated batches.
  const distributed::Communicator alone;
  auto [reference, reference_state] = distributed::shard(alone, bf16(make_model(dev, 3)), *make_rule(sc.rule));
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t at = s * b * p + comm.rank() * b;
    Tensor x = to(d.X.slice(at, at + b), dev).cast(DType::bf16), y = to(d.Y.slice(at, at + b), dev);
    auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return mse(m(x).f32(), y); }, model);
    for (const Tensor& g : grads) EXPECT_EQ(g.dtype(), DType::f32);
    optimisers::update(state, model, grads);
    Tensor xs = to(d.X.slice(s * b * p, (s + 1) * b * p), dev).cast(DType::bf16), ys = to(d.Y.slice(s * b * p, (s + 1) * b * p), dev);
    auto [loss_ref, grads_ref] = distributed::withgradient(alone, [&](auto& m) { return mse(m(xs).f32(), ys); }, reference);
    optimisers::update(reference_state, reference, grads_ref);
  }
  std::vector<Tensor> ps = params(distributed::gather_model(model));
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i].dtype(), DType::bf16);
    EXPECT_EQ(state.masters[i].dtype(), DType::f32);
    // this rank's chunk of the model is its master rounded to bf16
    const int64_t c = state.masters[i].numel(), n = ps[i].numel(), lo = std::min(n, comm.rank() * c), hi = std::min(n, lo + c);
    if (hi > lo) {
      std::vector<double> mine = ps[i].reshape({-1}).slice(lo, hi).f64().to_vector<double>();
      std::vector<double> master = state.masters[i].slice(0, hi - lo).cast(DType::bf16).f64().to_vector<double>();
      EXPECT_EQ(mine, master) << "array " << i;
    }
  }
  // A bf16 model's gradients are bf16: each rank's gradient of b rows is rounded once before the
  // float32 sum, the reference's of b * p rows once, so the masters agree to bf16 gradient rounding
  // (~0.4% of a step of eta = 0.02 per step), the bf16 arrays to about one bf16 step.
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t c = state.masters[i].numel(), lo = std::min(ps[i].numel(), comm.rank() * c),
                  hi = std::min(ps[i].numel(), lo + c);
    if (hi > lo) {
      EXPECT_LT(max_abs_diff({state.masters[i].slice(0, hi - lo)}, {reference_state.masters[i].slice(lo, hi)}), 2e-3) << "array " << i;
    }
  }
  EXPECT_LT(max_abs_diff(ps, params(distributed::gather_model(reference))), 1e-2);
}

// GradScaler({.comm}): one rank's chunk holds an inf, every rank skips the step together.
TEST_P(ShardParity, GradScalerSkipsOnEveryRank) {
  const ShardCase sc = std::get<1>(GetParam());
  if (sc.rule != "Adam") GTEST_SKIP() << "one rule is enough";
  auto comm = world();
  const Device dev = std::get<0>(GetParam());
  Model start = distributed::broadcast(comm, make_model(dev, 3), 0);
  auto [model, state] = distributed::shard(comm, start, optimisers::setup(optimisers::Adam(0.02), start), {.stage = sc.stage});
  optimisers::GradScaler scaler({.init_scale = 256, .comm = comm});
  Tensor x = to(randn({2, 6}), dev), y = to(zeros({2, 3}), dev);
  std::vector<Tensor> before;
  for (const Tensor& t : params(distributed::gather_model(model))) before.push_back(t.contiguous_copy());
  auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return scaler.scale(mse(m(x), y)); }, model);
  if (comm.rank() == comm.size() - 1) grads[0] = full_like(grads[0], std::numeric_limits<double>::infinity());
  EXPECT_FALSE(scaler.step(state, model, grads)) << "rank " << comm.rank();
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 128.0);
  EXPECT_EQ(max_abs_diff(params(distributed::gather_model(model)), before), 0.0);
  auto [loss2, grads2] = distributed::withgradient(comm, [&](auto& m) { return scaler.scale(mse(m(x), y)); }, model);
  EXPECT_TRUE(scaler.step(state, model, grads2));
  scaler.update();
  EXPECT_GT(max_abs_diff(params(distributed::gather_model(model)), before), 0.0);
}

// Checkpoints at this run's size: the folder loads back sharded (same ranks) and into one process.
TEST_P(ShardParity, CheckpointRoundTrips) {
  const ShardCase sc = std::get<1>(GetParam());
  if (sc.rule != "ClipNormAdam") GTEST_SKIP() << "one rule is enough";
  auto comm = world();
  const Device dev = std::get<0>(GetParam());
  const int64_t b = 3, p = comm.size();
  Data d = make_data(10 * b * p);
  Model start = distributed::broadcast(comm, make_model(dev, 3), 0);
  auto [model, state] = distributed::shard(comm, start, optimisers::setup(*make_rule(sc.rule), start), {.stage = sc.stage});
  sharded_run(comm, model, state, d, 0, b, 3, dev, false);
  const std::string dir = "shard_roundtrip_" + clean(to_string(dev)) + "_stage" + std::to_string(sc.stage) + "_np" + std::to_string(p);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
  distributed::barrier(comm);
  distributed::save_checkpoint(dir, model, state);
  distributed::save_checkpoint(dir, model, state);  // a second save replaces the first generation's files
  int files = 0;
  std::string listing;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    files += e.path().extension() == ".safetensors";
    listing += e.path().filename().string() + " ";
  }
  EXPECT_EQ(files, p) << listing;
  distributed::barrier(comm);  // every rank has looked before rank 0 adds the folder below
  // A save that fails on one rank (its file's name is taken by a folder) fails on every rank and
  // leaves the previous checkpoint as the one that loads.
  const std::string blocker = dir + "/g2-rank" + std::to_string(p - 1) + "-of" + std::to_string(p) + ".safetensors";
  if (comm.rank() == 0) std::filesystem::create_directories(blocker);
  distributed::barrier(comm);
  Model unsaved = make_model(dev, 55);  // other values, which must not reach the checkpoint
  auto unsaved_shard = distributed::shard(comm, unsaved, *make_rule(sc.rule), {.stage = sc.stage});
  EXPECT_THAT(error_of([&] { distributed::save_checkpoint(dir, unsaved_shard.model, unsaved_shard.state); }),
              ::testing::HasSubstr("could not write its shard"));
  distributed::barrier(comm);
  if (comm.rank() == 0) std::filesystem::remove_all(blocker);
  std::vector<double> after = sharded_run(comm, model, state, d, 3 * b * p, b, 3, dev, false);

  Model other = make_model(dev, 99);  // different values: all must come from the file
  auto [model2, state2] = distributed::shard(comm, other, optimisers::setup(*make_rule(sc.rule), other), {.stage = sc.stage});
  distributed::load_checkpoint(dir, model2, state2);
  EXPECT_EQ(state2.steps(), 3);
  std::vector<double> again = sharded_run(comm, model2, state2, d, 3 * b * p, b, 3, dev, false);
  EXPECT_EQ(again, after);
  EXPECT_EQ(max_abs_diff(params(distributed::gather_model(model2)), params(distributed::gather_model(model))), 0.0);

  Model single = make_model(dev, 98);
  auto opt = optimisers::setup(*make_rule(sc.rule), single);
  load_checkpoint(dir, single, opt);  // gathers the chunks
  EXPECT_EQ(opt.steps, 3);
  std::vector<double> single_losses = reference_run(single, opt, d, 3 * b * p, b * p, 3, dev, false);
  for (size_t s = 0; s < 3; ++s) EXPECT_NEAR(single_losses[s], after[s], 2e-6) << "step " << s;
  EXPECT_LT(max_abs_diff(params(single), params(distributed::gather_model(model))), 2e-5);
  distributed::barrier(comm);
}

// ---- a checkpoint written at np 4 loads at np 2 and in one process (ctest fixture) ----
// 5 steps at np 4 (batches of 3 per rank), saved; the loaders continue for 5 steps over the same rows
// (12 per step) and compare with the one-process reference trained 10 steps here.
TEST(ShardCheckpoint, SaveOrResume) {
  const char* dir = std::getenv("FLUX_SHARD_CHECKPOINT");
  const char* mode = std::getenv("FLUX_SHARD_CHECKPOINT_MODE");
  if (!dir || !mode) GTEST_SKIP() << "FLUX_SHARD_CHECKPOINT(_MODE) unset (the ctest entries mpi.shard_checkpoint.* set them)";
  auto comm = world();
  const Device dev;
  const int64_t rows = 12;
  Data d = make_data(10 * rows);
  Model reference = make_model(dev, 3);
  auto opt_ref = optimisers::setup(*make_rule("ClipNormAdam"), reference);
  std::vector<double> want = reference_run(reference, opt_ref, d, 0, rows, 10, dev, true);
  const char* stage_env = std::getenv("FLUX_SHARD_CHECKPOINT_STAGE");  // of the saving and the loading run
  const int stage = stage_env ? std::atoi(stage_env) : 2;
  if (std::string(mode) == "save") {
    ASSERT_EQ(comm.size(), 4) << "the checkpoint is written at np 4";
    Model start = distributed::broadcast(comm, make_model(dev, 3), 0);
    auto [model, state] = distributed::shard(comm, start, optimisers::setup(*make_rule("ClipNormAdam"), start), {.stage = stage});
    std::vector<double> got = sharded_run(comm, model, state, d, 0, rows / 4, 5, dev, true);
    for (size_t s = 0; s < 5; ++s) EXPECT_NEAR(got[s], want[s], 2e-6) << "step " << s;
    if (comm.rank() == 0) std::filesystem::remove_all(dir);
    distributed::barrier(comm);
    distributed::save_checkpoint(dir, model, state);
    return;
  }
  ASSERT_EQ(std::string(mode), "resume");
  ASSERT_TRUE(std::filesystem::exists(std::string(dir) + "/index.json")) << "run mpi.shard_checkpoint.save_np4 first";
  std::vector<double> got;
  std::vector<Tensor> final_params;
  Model model = make_model(dev, 77);
  if (comm.size() == 1) {
    auto opt = optimisers::setup(*make_rule("ClipNormAdam"), model);
    load_checkpoint(dir, model, opt);
    EXPECT_EQ(opt.steps, 5);
    got = reference_run(model, opt, d, 5 * rows, rows, 5, dev, true);
    final_params = params(model);
  } else {
    ASSERT_EQ(rows % comm.size(), 0);
    auto [sharded, state] = distributed::shard(comm, model, optimisers::setup(*make_rule("ClipNormAdam"), model),
                                               {.stage = stage == 3 ? 3 : 1});
    distributed::load_checkpoint(dir, sharded, state);
    EXPECT_EQ(state.steps(), 5);
    got = sharded_run(comm, sharded, state, d, 5 * rows, rows / comm.size(), 5, dev, true);
    final_params = params(distributed::gather_model(sharded));
  }
  for (size_t s = 0; s < 5; ++s) EXPECT_NEAR(got[s], want[5 + s], 2e-6 * (1 + std::abs(want[5 + s]))) << "step " << 5 + s;
  EXPECT_LT(max_abs_diff(final_params, params(reference)), 2e-5);
}

// ---- errors ----
TEST(Shard, BadOptionsAreNamed) {
  auto comm = world();
  Model m = make_model(Device(), 1);
  auto opt = optimisers::setup(optimisers::Adam(), m);
  EXPECT_THAT(error_of([&] { distributed::shard(comm, m, opt, {.stage = 4}); }),
              ::testing::HasSubstr("[distributed::shard] .stage must be 1, 2 or 3, got 4"));
  EXPECT_THAT(error_of([&] { distributed::shard(comm, m, opt, {.stage = 0}); }),
              ::testing::HasSubstr("[distributed::shard] .stage must be 1, 2 or 3, got 0"));
  EXPECT_THAT(error_of([&] { distributed::shard(comm, m, opt, {.stage = 1, .wire = DType::f16}); }),
              ::testing::HasSubstr("[distributed::shard] .wire must be BFloat16"));
  auto small = Chain(Dense(2, 2));
  EXPECT_THAT(error_of([&] { distributed::shard(comm, m, optimisers::setup(optimisers::Adam(), small)); }),
              ::testing::HasSubstr("[distributed::shard] the optimiser state has 2 arrays but the model has 6"));
  EXPECT_THAT(error_of([&] { load_checkpoint("no_such_sharded_checkpoint", m, opt); }), ::testing::HasSubstr("no_such"));
}

// ---- stage 3 ----
// Misuse: arrays tied between two layers cannot be gathered one layer at a time; f must call the
// model, once.
TEST(Shard, Stage3RefusesWhatItCannotShard) {
  auto comm = world();
  seed(5);
  Dense shared(4, 4);
  auto tied = Chain(shared, Dense(4, 4), shared);
  EXPECT_THAT(error_of([&] { distributed::shard(comm, tied, optimisers::Adam(), {.stage = 3}); }),
              ::testing::HasSubstr("[distributed::shard] stage 3 gathers one layer of the Chain at a time, but array "
                                   "0.weight is tied between layers 0 and 2"));
  Model m = distributed::broadcast(comm, make_model(Device(), 1), 0);
  auto sharded = distributed::shard(comm, m, optimisers::Adam(), {.stage = 3});
  auto& model = sharded.model;  // a reference, not a structured binding: clang 15 captures no binding
  Tensor x = randn({2, 6}), y = randn({2, 3});
  EXPECT_THAT(error_of([&] { distributed::withgradient(comm, [&](auto&) { return sum(x); }, model); }),
              ::testing::HasSubstr("[distributed::withgradient] stage 3: f did not call the model"));
  EXPECT_THAT(error_of([&] { distributed::withgradient(comm, [&](auto& s) { return mse(s(x), y) + mse(s(x), y); }, model); }),
              ::testing::HasSubstr("[distributed::withgradient] stage 3: the model was called more than once in one step"));
  // between steps the model holds no trainable array; called outside withgradient it gathers them
  for (const Tensor& t : params(model.model)) EXPECT_EQ(t.impl()->storage->bytes, 0u);
  EXPECT_LT(max_abs_diff({model(x)}, {m(x)}), 1e-6);
  for (const Tensor& t : params(model.model)) EXPECT_EQ(t.impl()->storage->bytes, 0u);
}

// Memory per rank (the live-storage counter, src/storage_stats.hpp) of 8 Dense(256 => 256) layers
// (2.1 MB of float32 arrays) trained with Adam: between steps a stage-3 rank holds its 1/N of the
// masters and of the two moments, and no whole array; during a step at most a few layers' arrays are
// whole at once. Stage 2 beside it keeps the whole model on every rank.
TEST(Shard, Stage3ParameterMemoryPerRank) {
  auto comm = world();
  const int64_t p = comm.size(), width = 256, batch = 4;
  using Wide = Chain<Dense, Dense, Dense, Dense, Dense, Dense, Dense, Dense>;
  auto make = [&] {
    seed(21);
    return distributed::broadcast(comm, Wide(Dense(width, width, relu), Dense(width, width, relu), Dense(width, width, relu),
                                             Dense(width, width, relu), Dense(width, width, relu), Dense(width, width, relu),
                                             Dense(width, width, relu), Dense(width, width)),
                                  0);
  };
  const double whole = double(8 * (width * width + width) * 4);  // bytes of the float32 arrays
  const double layer = double((width * width + width) * 4);
  Tensor x = randn({batch, width}), y = randn({batch, width});
  for (int stage : {2, 3}) {
    const size_t before = flux::detail::live_storage_bytes();
    auto [model, state] = [&] {
      Wide start = make();
      return distributed::shard(comm, start, optimisers::Adam(1e-3), {.stage = stage, .bucket_bytes = 64 << 10});
    }();  // `start` is gone: what lives is the sharded model and state
    const double held = double(flux::detail::live_storage_bytes()) - double(before);
    double peak = 0;
    for (int step = 0; step < 2; ++step) {
      const size_t at = flux::detail::live_storage_bytes();
      flux::detail::reset_peak_storage_bytes();
      auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return mse(m(x), y); }, model);
      optimisers::update(state, model, grads);
      peak = std::max(peak, double(flux::detail::peak_storage_bytes()) - double(at));
    }
    const double after = double(flux::detail::live_storage_bytes()) - double(before);
    if (stage == 3) {
      // 8 layers: 8 gathers in the forward, 7 again for the backward (the last layer's arrays stay);
      // all but the first started one layer before they were needed
      const distributed::LayerGatherStats g = distributed::last_layer_gather_stats();
      EXPECT_EQ(g.gathers, 15);
      EXPECT_EQ(g.prefetched, 14);
      if (comm.rank() == 0)
        std::printf("[shard gathers] np %lld: %d gathers, %d prefetched, %d complete when needed, %.2f ms waiting\n",
                    static_cast<long long>(p), g.gathers, g.prefetched, g.ready_when_needed, 1e3 * g.wait_seconds);
    }
    if (comm.rank() == 0)
      std::printf("[shard memory] stage %d np %lld: between steps %.3f MB per rank (whole float32 model %.3f MB), "
                  "step peak above that %.3f MB, peak %.3f MB\n",
                  stage, static_cast<long long>(p), held / 1e6, whole / 1e6, peak / 1e6, (held + peak) / 1e6);
    // masters and two Adam moments: 3 x whole / p, up to the padding of each array
    const double sharded_part = 3 * whole / double(p) + 3 * 16 * 4 * double(p);
    if (stage == 3) {
      EXPECT_LE(held, sharded_part) << "stage 3 keeps no whole array between steps";
      EXPECT_LE(after, sharded_part);
      // during a step: this rank's gradient chunks of every array (whole / p, until update), and whole
      // at once only the layer that computes, the next one's gather (receive and send buffers) and
      // the gradients not yet sent (buckets of 64 kB, one layer each here) with the reduce-scatter's
      // exchanges in flight (at most two, each holding its gradient or send buffer and the ranks'
      // copies of this rank's chunk: a layer each here)
      EXPECT_LT(peak, whole / double(p) + 6.5 * layer) << "whole model " << whole;
    } else {
      EXPECT_GE(held, whole) << "stage 2 keeps the whole model";
      EXPECT_LE(held, whole + sharded_part);
    }
    RecordProperty("stage" + std::to_string(stage) + "_held_bytes", std::to_string(held));
    RecordProperty("stage" + std::to_string(stage) + "_step_peak_bytes", std::to_string(peak));
  }
}

// Stage 3 on a Chain with layers that hold no array (MaxPool, flatten, an activation), BatchNorm's
// running statistics (non-trainable, updated in place by the forward), arrays tied inside one layer
// (a SkipConnection around a Chain using one Dense twice) and a layer whose array is never read
// (its gradient is final before backward starts): it must train exactly as stage 2 on
// the same ranks (the same per-rank batches and statistics), on every device.
// A layer whose array the forward does not read: its gradient is zero and final before backward starts.
struct Spare {
  Tensor spare;
  Tensor operator()(const Tensor& x) const { return x; }
};
FLUX_LAYER(Spare, spare)

class ShardStage3Layers : public ::testing::TestWithParam<Device> {};
INSTANTIATE_TEST_SUITE_P(Devices, ShardStage3Layers, ::testing::ValuesIn(test_devices()),
                         [](const auto& info) { return clean(to_string(info.param)); });
TEST_P(ShardStage3Layers, ConvBatchNormAndTiedLayersMatchStage2) {
  auto comm = world();
  const Device dev = GetParam();
  auto make = [&] {
    seed(41);
    Dense tied(12, 12, tanh_act);
    return distributed::broadcast(comm,
                                  Chain(Conv({3, 3}, 2, 4), BatchNorm(4, relu), MaxPool({2, 2}), flatten, Dense(4 * 3 * 3, 12),
                                        SkipConnection(Chain(tied, tied), plus), relu, Spare{randn({5})}, Dense(12, 3)) |
                                      dev,
                                  0);
  };
  seed(42 + uint64_t(comm.rank()));
  std::vector<Tensor> xs, ys;
  for (int s = 0; s < 6; ++s) {
    xs.push_back(to(randn({3, 2, 8, 8}), dev));
    ys.push_back(to(randn({3, 3}), dev));
  }
  auto train = [&](int stage) {
    auto start = make();
    auto r = distributed::shard(comm, start, optimisers::Adam(0.01), {.stage = stage, .bucket_bytes = 256});
    std::vector<double> losses;
    for (size_t s = 0; s < xs.size(); ++s) {
      auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return mse(m(xs[s]), ys[s]); }, r.model);
      optimisers::update(r.state, r.model, grads);
      losses.push_back(mean_over_ranks(comm, loss));
    }
    auto whole = distributed::gather_model(r.model);
    std::vector<Tensor> all;  // trainable arrays and BatchNorm's running statistics
    for (const auto& l : distributed::detail::named_leaves(whole)) all.push_back(l.tensor);
    return std::make_pair(losses, all);
  };
  auto [want_losses, want] = train(2);
  auto [got_losses, got] = train(3);
  for (size_t s = 0; s < want_losses.size(); ++s) EXPECT_NEAR(got_losses[s], want_losses[s], 1e-6) << "step " << s;
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(max_abs_diff(got, want), 1e-5);
}

// A model that does not fit one process's FLUX_CPU_MEMORY_LIMIT trains at np 4, stage 3 (the ctest
// entries mpi.shard_memory_limit.* set the limit and FLUX_SHARD_MEMORY_MODE). 8 Dense(512 => 512):
// 8.4 MB of float32 arrays; one process's Adam training holds the arrays, their gradients and two
// moments (33.6 MB and more); a stage-3 rank of 4 holds a quarter of the masters and moments
// (6.3 MB) between steps, and the whole model only while shard() cuts it.
TEST(ShardMemoryLimit, Stage3FitsWhereOneProcessDoesNot) {
  const char* mode = std::getenv("FLUX_SHARD_MEMORY_MODE");
  if (!mode) GTEST_SKIP() << "FLUX_SHARD_MEMORY_MODE unset (the ctest entries mpi.shard_memory_limit.* set it)";
  auto comm = world();
  using Big = Chain<Dense, Dense, Dense, Dense, Dense, Dense, Dense, Dense>;
  const int64_t width = 512;
  auto make = [&] {
    seed(31);  // the same values on every rank, without a broadcast (which would hold a second copy)
    return Big(Dense(width, width, relu), Dense(width, width, relu), Dense(width, width, relu), Dense(width, width, relu),
               Dense(width, width, relu), Dense(width, width, relu), Dense(width, width, relu), Dense(width, width));
  };
  seed(32);
  Tensor x = randn({8, width}), y = randn({8, width});
  if (std::string(mode) == "plain") {
    EXPECT_THAT(error_of([&] {
                  Big model = make();
                  auto opt = optimisers::setup(optimisers::Adam(1e-3), model);
                  for (int step = 0; step < 3; ++step) {
                    auto [loss, grads] = withgradient([&](const Big& m) { return mse(m(x), y); }, model);
                    optimisers::update(opt, model, grads);
                  }
                }),
                ::testing::HasSubstr("FLUX_CPU_MEMORY_LIMIT"));
    return;
  }
  ASSERT_EQ(std::string(mode), "stage3");
  ASSERT_EQ(comm.size(), 4) << "the limit is set for 4 ranks";
  auto sharded = [&] { return distributed::shard(comm, make(), optimisers::Adam(1e-3), {.stage = 3, .bucket_bytes = 1 << 20}); }();
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    auto [loss, grads] = distributed::withgradient(comm, [&](auto& m) { return mse(m(x), y); }, sharded.model);
    optimisers::update(sharded.state, sharded.model, grads);
    losses.push_back(loss.item<double>());
  }
  EXPECT_LT(losses.back(), losses.front());
  if (comm.rank() == 0)
    std::printf("[shard memory limit] stage 3 np 4: peak live storage %.2f MB per rank, losses %.4f -> %.4f\n",
                double(flux::detail::peak_storage_bytes()) / 1e6, losses.front(), losses.back());
}

int main(int argc, char** argv) {
  distributed::initialize();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
