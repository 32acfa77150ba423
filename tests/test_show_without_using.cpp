// Printing a user's layer from code that has no `using namespace flux` (issue 18): FLUX_LAYER gives
// the type an operator<< in its own namespace, so `std::cout << layer` compiles and prints as Flux
// shows a @layer struct, a container of children prints on several lines, and an operator<< the user
// wrote for the type still wins. Nothing in this file brings flux's names into scope.
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "flux/flux.hpp"

namespace plain_user {

struct Residual {
  flux::Dense inner;
  flux::Tensor operator()(const flux::Tensor& x) const { return x + inner(x); }
};
FLUX_LAYER(Residual, inner)

/// A layer whose author wrote its display.
struct Pretty {
  flux::Dense inner;
  flux::Tensor operator()(const flux::Tensor& x) const { return inner(x); }
};
FLUX_LAYER(Pretty, inner)
std::ostream& operator<<(std::ostream& os, const Pretty& p) { return os << "Pretty(width " << p.inner.out_features() << ")"; }

/// A user's container: shows its two children on their own lines, as SkipConnection does.
struct Twin {
  flux::Dense left, right;
  flux::Tensor operator()(const flux::Tensor& x) const { return left(x) + right(x); }
};
FLUX_LAYER(Twin, left, right)
inline auto flux_show_children(const Twin& t) { return std::tie(t.left, t.right); }

// Printing as user code does it: through std::ostream, from a namespace that does not use flux.
template <class M> std::string print(const M& m) {
  std::ostringstream os;
  static_cast<std::ostream&>(os) << m;
  return os.str();
}
template <class M> std::string print_to_stringstream(const M& m) {
  std::ostringstream os;
  os << m;
  return os.str();
}

}  // namespace plain_user

TEST(ShowWithoutUsing, UserLayerPrintsThroughItsOwnNamespace) {
  flux::seed(3);
  plain_user::Residual r{flux::Dense(8, 8, flux::relu)};
  // A field holds a layer: the tree Flux 0.15 shows for a @layer struct (issue 32).
  const std::string tree = "Residual(\n"
                          "  Dense(8 => 8, relu),                  # 72 parameters\n"
                          ")";
  EXPECT_EQ(plain_user::print(r), tree);
  EXPECT_EQ(plain_user::print_to_stringstream(r), tree);
  EXPECT_EQ(flux::repr(r), "Residual(Dense(8 => 8, relu))  # 72 parameters");
  // Moved to a device it prints the same (the walk and the display agree).
  EXPECT_EQ(plain_user::print(r | flux::Device()), tree);
}

TEST(ShowWithoutUsing, UsersOwnOperatorWins) {
  plain_user::Pretty p{flux::Dense(4, 3)};
  EXPECT_EQ(plain_user::print(p), "Pretty(width 3)");
  EXPECT_EQ(plain_user::print_to_stringstream(p), "Pretty(width 3)");
  EXPECT_EQ(flux::repr(flux::Chain(flux::Dense(2, 4), p)), "Chain(Dense(2 => 4), Pretty(width 3))  # 27 parameters");
}

TEST(ShowWithoutUsing, UserContainerAndChainsPrintOnSeveralLines) {
  flux::seed(4);
  plain_user::Twin t{flux::Dense(2, 3), flux::Dense(2, 3)};
  EXPECT_EQ(plain_user::print(t),
            "Twin(\n"
            "  Dense(2 => 3),                        # 9 parameters\n"
            "  Dense(2 => 3),                        # 9 parameters\n"
            ")                   # Total: 4 arrays, 18 parameters, 72 bytes.");
  auto model = flux::Chain(plain_user::Residual{flux::Dense(8, 8, flux::relu)}, flux::Dense(8, 2));
  EXPECT_EQ(plain_user::print(model),
            "Chain(\n"
            "  Residual(\n"
            "    Dense(8 => 8, relu),                # 72 parameters\n"
            "  ),\n"
            "  Dense(8 => 2),                        # 18 parameters\n"
            ")                   # Total: 4 arrays, 90 parameters, 360 bytes.");
}
