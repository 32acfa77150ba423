// Activations by their plain names in a Chain beside <cmath> (tests/porting.cmake).
// FLUX_CASE 1 (compiles): `using namespace std` and `using namespace flux` together: `tanh` then
//   names std's overloads (one a template), ::tanh and flux::tanh; Chain takes flux's.
// FLUX_CASE 2 (fails with flux's message): no `using namespace flux`, so `tanh` is <cmath>'s
//   double -> double; the static_assert says to write flux::tanh.
#include <cmath>

#include <flux/flux.hpp>

#if FLUX_CASE == 1
using namespace std;
using namespace flux;
int main() {
  auto m = Chain(Dense(2, 3), tanh, Dense(3, 1), sigmoid, relu);
  auto d = Chain(Dense(2, 3, tanh), flux::tanh, tanh_act);
  static_assert(is_same_v<decltype(m), Chain<Dense, FunctionLayer, Dense, Sigmoid, Relu>>);
  return int(m(zeros({1, 2})).numel() + d(zeros({1, 2})).numel()) - 4;
}
#elif FLUX_CASE == 2
int main() {
  auto m = flux::Chain(flux::Dense(2, 3), tanh, flux::Dense(3, 1));
  return int(m(flux::zeros({1, 2})).numel());
}
#endif
