// C++ library fixture: a member function whose mangled name the tests look
// up with dlsym (_ZN4demo6Widget8allocateEm) and expect demangled.
#include <cstdlib>
#include <cstring>

namespace demo {

class Widget {
public:
	void *allocate(unsigned long n);
	unsigned long total;
};

void *Widget::allocate(unsigned long n)
{
	total += n;
	void *p = std::malloc(n);
	if (p == nullptr)
		std::abort();
	std::memset(p, 0, n);
	return p;
}

} // namespace demo
