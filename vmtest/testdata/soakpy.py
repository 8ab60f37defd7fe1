# The soak's Python programs that never touch CUDA (vmtest/soak_test.go):
# each starts the interpreter, whose layout the tracer learns from its
# loader's note, runs a thread and exits.
import threading

t = threading.Thread(target=sum, args=(range(1000),))
t.start()
t.join()
