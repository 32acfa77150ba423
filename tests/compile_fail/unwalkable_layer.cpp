// Compile-failure cases (tests/compile_fail.cmake): a struct holding tensors or layers that is not
// walkable must not compile where it is used as a layer; FLUX_CASE picks the use and the mistake.
// The expected diagnostic is the static_assert in flux/functor.hpp naming FLUX_LAYER.
#include <flux/flux.hpp>
using namespace flux;

namespace mine {
// A user's layer with a constructor and no FLUX_LAYER: its Dense would be skipped silently.
struct Residual {
  Dense inner;
  explicit Residual(int n) : inner(n, n, relu) {}
  Tensor operator()(const Tensor& x) const { return x + inner(x); }
};
// A simple aggregate holding a tensor, no FLUX_LAYER.
struct Scale {
  Tensor s;
  Tensor operator()(const Tensor& x) const { return x * s; }
};
// FLUX_LAYER written outside this struct's namespace (below, in the global one): not found.
struct Shift {
  Tensor b;
  Tensor operator()(const Tensor& x) const { return x + b; }
};
}  // namespace mine
FLUX_LAYER(mine::Shift, b)  // wrong: must be inside namespace mine

namespace mine {
// Walkable itself, but one listed field is not: the walk would skip its tensors.
struct Outer {
  Dense head;
  Residual body;
  Tensor operator()(const Tensor& x) const { return head(body(x)); }
};
FLUX_LAYER(Outer, head, body)
}  // namespace mine

namespace mine {
// A class template holding a layer, no FLUX_LAYER (issue 32: templates are layers like any struct).
template <class A> struct Generic {
  A inner;
  Tensor operator()(const Tensor& x) const { return inner(x); }
};
// A class template declared with FLUX_LAYER, one of whose listed fields is not walkable.
template <class A> struct Wrapper {
  Dense head;
  A body;
  Tensor operator()(const Tensor& x) const { return head(body(x)); }
};
FLUX_LAYER(Wrapper, head, body)
// FLUX_LAYER for a class template written outside its namespace (below): not found.
template <class A> struct Elsewhere {
  A inner;
  Tensor operator()(const Tensor& x) const { return inner(x); }
};
}  // namespace mine
FLUX_LAYER(mine::Elsewhere, inner)  // wrong: must be inside namespace mine

int main() {
  Tensor x = ones({2, 4});
#if FLUX_CASE == 1  // in a Chain
  auto model = Chain(Dense(4, 4), mine::Residual(4));
  (void)model(x);
#elif FLUX_CASE == 2  // gradient of an aggregate
  mine::Scale m{ones({4})};
  (void)gradient([&](const mine::Scale& s) { return sum(s(x)); }, m);
#elif FLUX_CASE == 3  // params with FLUX_LAYER in the wrong namespace
  (void)params(mine::Shift{ones({4})});
#elif FLUX_CASE == 4  // | dev through a walkable layer with an unwalkable field
  mine::Outer m{Dense(4, 4), mine::Residual(4)};
  (void)(m | Device());
#elif FLUX_CASE == 5  // fmap
  (void)fmap([](const Tensor& t) { return t * 2.0; }, mine::Residual(4));
#elif FLUX_CASE == 6  // optimisers::setup
  (void)optimisers::setup(optimisers::Adam(1e-3), mine::Residual(4));
#elif FLUX_CASE == 7  // a std::vector of unwalkable layers
  std::vector<mine::Scale> stack{{ones({4})}};
  (void)parameter_count(stack);
#elif FLUX_CASE == 8  // a class template without FLUX_LAYER, in a Chain
  auto model = Chain(Dense(4, 4), mine::Generic<Dense>{Dense(4, 4)});
  (void)model(x);
#elif FLUX_CASE == 9  // a FLUX_LAYER class template whose field is an unwalkable template
  mine::Wrapper<mine::Generic<Dense>> m{Dense(4, 4), {Dense(4, 4)}};
  (void)params(m);
#elif FLUX_CASE == 10  // FLUX_LAYER of a class template in the wrong namespace
  (void)optimisers::setup(optimisers::Adam(1e-3), mine::Elsewhere<Dense>{Dense(4, 4)});
#else
#error "FLUX_CASE must be 1..10"
#endif
  return 0;
}
