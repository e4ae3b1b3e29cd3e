// The compiled parts of Boost.Asio (with its SSL layer) and Boost.Beast,
// once for the library and everything linked with it, rather than inline in
// every file that includes them (BOOST_ASIO_SEPARATE_COMPILATION and
// BOOST_BEAST_SEPARATE_COMPILATION, set on the target in CMakeLists.txt).
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
