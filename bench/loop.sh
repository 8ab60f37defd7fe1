# Sourced by the bench scripts: builds, in the scratch directory $W, the
# stand-in libcudart ($LIB, built without frame pointers as NVIDIA's is)
# and bench/loop.c against it ($W/loop).
gcc -shared -fPIC -O2 -fomit-frame-pointer -pthread -Wl,-soname,libcudart.so.12 \
	-Wl,--version-script=vmtest/testdata/fakecudart.map -o "$W/libcudart.so.12" vmtest/testdata/fakecudart.c
ln -s libcudart.so.12 "$W/libcudart.so"
gcc -O2 -fno-omit-frame-pointer -I vmtest/testdata -o "$W/loop" bench/loop.c -L"$W" -lcudart -Wl,-rpath,"$W"
LIB=$W/libcudart.so.12
