// Printing what users put in a Chain (issue 18): their FLUX_LAYER structs show their fields as Flux
// shows a @layer struct, their own operator<< is used when they wrote one, and lambdas, function
// objects, functions and std::function print readably instead of "#layer".
#include <functional>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "flux/flux.hpp"

using namespace flux;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace show_test {

struct Residual {
  Dense inner;
  Tensor operator()(const Tensor& x) const { return x + inner(x); }
};
FLUX_LAYER(Residual, inner)

struct Scale {
  Tensor weight;
  Tensor operator()(const Tensor& x) const { return x * weight; }
};
FLUX_LAYER(Scale, weight)

/// Two layers and a vector of them: every field is shown in FLUX_LAYER's order.
struct Branches {
  Dense first;
  std::vector<Dense> rest;
  Tensor operator()(const Tensor& x) const { return first(x); }
};
FLUX_LAYER(Branches, first, rest)

/// A layer whose author wrote its display.
struct Pretty {
  Dense inner;
  Tensor operator()(const Tensor& x) const { return inner(x); }
};
FLUX_LAYER(Pretty, inner)
std::ostream& operator<<(std::ostream& os, const Pretty& p) {
  return os << "Pretty(width " << p.inner.out_features() << ")";
}

/// A layer and a plain tensor side by side: the tree names the tensor by its field.
struct Gate {
  Dense inner;
  Tensor scale;
  Tensor operator()(const Tensor& x) const { return inner(x) * scale; }
};
FLUX_LAYER(Gate, inner, scale)

/// A function object without tensors (needs no FLUX_LAYER).
struct AddOne {
  Tensor operator()(const Tensor& x) const { return x + 1.0; }
};

Tensor twice(const Tensor& x) { return x * 2.0; }

}  // namespace show_test

namespace {
template <class M> std::string to_text(const M& m) {
  std::ostringstream os;
  os << m;
  return os.str();
}
}  // namespace

TEST(ShowUserLayers, FluxLayerStructsShowTheirFields) {
  seed(1);
  auto model = Chain(show_test::Residual{Dense(8, 8, relu)}, Dense(8, 2));
  EXPECT_EQ(repr(model), "Chain(Residual(Dense(8 => 8, relu)), Dense(8 => 2))  # 90 parameters");
  EXPECT_EQ(to_text(model),
            "Chain(\n"
            "  Residual(\n"  // a field holds a layer: nested, as Flux 0.15's @layer (issue 32)
            "    Dense(8 => 8, relu),                # 72 parameters\n"
            "  ),\n"
            "  Dense(8 => 2),                        # 18 parameters\n"
            ")                   # Total: 4 arrays, 90 parameters, 360 bytes.");
  // On its own (with `using namespace flux`): the same tree (no total for two arrays, as Flux);
  // repr gives the one-line form with the count.
  EXPECT_EQ(to_text(show_test::Residual{Dense(3, 3)}),
            "Residual(\n"
            "  Dense(3 => 3),                        # 12 parameters\n"
            ")");
  EXPECT_EQ(repr(show_test::Residual{Dense(3, 3)}), "Residual(Dense(3 => 3))  # 12 parameters");
  // Tensor fields by their name and summary; vectors of layers in brackets; nesting.
  EXPECT_EQ(repr(show_test::Scale{ones({4})}), "Scale(weight = 4-element Tensor{Float32, CPU})  # 4 parameters");
  EXPECT_EQ(repr(Chain(show_test::Branches{Dense(2, 2), {Dense(2, 3), Dense(3, 1)}})),
            "Chain(Branches(Dense(2 => 2), [Dense(2 => 3), Dense(3 => 1)]))  # 19 parameters");
  EXPECT_EQ(repr(show_test::Residual{Dense(2, 2)}), repr(show_test::Residual{Dense(2, 2)} | Device()));
}

TEST(ShowUserLayers, AUsersOwnOperatorIsUsed) {
  auto model = Chain(Dense(2, 4), show_test::Pretty{Dense(4, 3)});
  EXPECT_EQ(repr(model), "Chain(Dense(2 => 4), Pretty(width 3))  # 27 parameters");
  EXPECT_THAT(to_text(model), HasSubstr("  Pretty(width 3),                      # 15 parameters\n"));
  EXPECT_EQ(to_text(show_test::Pretty{Dense(4, 3)}), "Pretty(width 3)");
}

TEST(ShowUserLayers, CallablesPrintReadably) {
  auto lambda = [](const Tensor& x) { return x * 3.0; };
  auto model = Chain(Dense(2, 2), lambda, show_test::AddOne{}, std::function<Tensor(const Tensor&)>(show_test::twice),
                     square, show_test::twice);
  const std::string line = repr(model);
  EXPECT_THAT(line, StartsWith("Chain(Dense(2 => 2), lambda(Tensor const&)#1 in "));
  EXPECT_THAT(line, HasSubstr("ShowUserLayers_CallablesPrintReadably_Test::TestBody()"));  // where it was written
  EXPECT_THAT(line, HasSubstr(", show_test::AddOne(), std::function<Tensor (Tensor const&)>, "));
  EXPECT_THAT(line, HasSubstr(", square, "));  // a library function, by its symbol
  // The test program's own function: its symbol where the executable exports it, else its type.
  EXPECT_THAT(line, AnyOf(HasSubstr(", show_test::twice)"), HasSubstr(", Tensor (*)(Tensor const&))")));
  EXPECT_THAT(line, ::testing::Not(HasSubstr("#layer")));
  // The model still runs with all of them.
  Tensor y = model(ones({1, 2}));
  EXPECT_EQ(y.shape(), (Shape{1, 2}));
  // In the multi-line display too.
  EXPECT_THAT(to_text(model), HasSubstr("  show_test::AddOne(),\n"));
}

// A layer holding a layer and a plain tensor: in the tree the tensor is named by its field (issue 49),
// and every nested line's comment starts in the same column as the outer ones (Flux's _layer_show:
// column 40 below the top, pushed right only by a line longer than that).
TEST(ShowUserLayers, TensorFieldsAreNamedAndNestedCommentsAlign) {
  seed(2);
  auto model = Chain(Chain(Dense(2, 3), Chain(Dense(3, 3, relu))), show_test::Gate{Dense(3, 3), ones({3})}, Dense(3, 1));
  const std::string text = to_text(model);
  EXPECT_EQ(text,
            "Chain(\n"
            "  Chain(\n"
            "    Dense(2 => 3),                      # 9 parameters\n"
            "    Chain(\n"
            "      Dense(3 => 3, relu),              # 12 parameters\n"
            "    ),\n"
            "  ),\n"
            "  Gate(\n"
            "    Dense(3 => 3),                      # 12 parameters\n"
            "    scale = 3-element Tensor{Float32, CPU},  # 3 parameters\n"
            "  ),\n"
            "  Dense(3 => 1),                        # 4 parameters\n"
            ")                   # Total: 9 arrays, 40 parameters, 160 bytes.");
}
