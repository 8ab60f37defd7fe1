# Allocations from Python frames where the BPF walk finds them in
# different places (vmtest/python_test.go TestPythonFramesShapes): a
# generator's and a coroutine's frame (their own objects, not the data
# stack), frames too large for one page or one data stack chunk, a call
# back from C (a shim frame between two runs of the interpreter loop), and
# a second Python thread, twice. argv[1] is the runtime stand-in. LINE:tag marks the line a frame
# must report.
import ctypes
import sys
import threading
import time

lib = ctypes.CDLL(sys.argv[1])


def alloc(mib):
    p = ctypes.c_void_p()
    return lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(mib << 20))  # LINE:alloc


def gen():
    yield alloc(7)  # LINE:gen


async def coro():
    return alloc(17)  # LINE:coro


def run_coro():
    c = coro()
    try:
        c.send(None)  # LINE:run-coro
    except StopIteration as e:
        return e.value


def big(k):
    # 400 locals: a frame of over 3 KiB on the data stack, so that eight
    # of them fill more than one 16 KiB chunk.
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, v16, v17, v18, v19, v20, v21, v22, v23, v24, v25, v26, v27, v28, v29, v30, v31, v32, v33, v34, v35, v36, v37, v38, v39, v40, v41, v42, v43, v44, v45, v46, v47, v48, v49, v50, v51, v52, v53, v54, v55, v56, v57, v58, v59, v60, v61, v62, v63, v64, v65, v66, v67, v68, v69, v70, v71, v72, v73, v74, v75, v76, v77, v78, v79, v80, v81, v82, v83, v84, v85, v86, v87, v88, v89, v90, v91, v92, v93, v94, v95, v96, v97, v98, v99, v100, v101, v102, v103, v104, v105, v106, v107, v108, v109, v110, v111, v112, v113, v114, v115, v116, v117, v118, v119, v120, v121, v122, v123, v124, v125, v126, v127, v128, v129, v130, v131, v132, v133, v134, v135, v136, v137, v138, v139, v140, v141, v142, v143, v144, v145, v146, v147, v148, v149, v150, v151, v152, v153, v154, v155, v156, v157, v158, v159, v160, v161, v162, v163, v164, v165, v166, v167, v168, v169, v170, v171, v172, v173, v174, v175, v176, v177, v178, v179, v180, v181, v182, v183, v184, v185, v186, v187, v188, v189, v190, v191, v192, v193, v194, v195, v196, v197, v198, v199, v200, v201, v202, v203, v204, v205, v206, v207, v208, v209, v210, v211, v212, v213, v214, v215, v216, v217, v218, v219, v220, v221, v222, v223, v224, v225, v226, v227, v228, v229, v230, v231, v232, v233, v234, v235, v236, v237, v238, v239, v240, v241, v242, v243, v244, v245, v246, v247, v248, v249, v250, v251, v252, v253, v254, v255, v256, v257, v258, v259, v260, v261, v262, v263, v264, v265, v266, v267, v268, v269, v270, v271, v272, v273, v274, v275, v276, v277, v278, v279, v280, v281, v282, v283, v284, v285, v286, v287, v288, v289, v290, v291, v292, v293, v294, v295, v296, v297, v298, v299, v300, v301, v302, v303, v304, v305, v306, v307, v308, v309, v310, v311, v312, v313, v314, v315, v316, v317, v318, v319, v320, v321, v322, v323, v324, v325, v326, v327, v328, v329, v330, v331, v332, v333, v334, v335, v336, v337, v338, v339, v340, v341, v342, v343, v344, v345, v346, v347, v348, v349, v350, v351, v352, v353, v354, v355, v356, v357, v358, v359, v360, v361, v362, v363, v364, v365, v366, v367, v368, v369, v370, v371, v372, v373, v374, v375, v376, v377, v378, v379, v380, v381, v382, v383, v384, v385, v386, v387, v388, v389, v390, v391, v392, v393, v394, v395, v396, v397, v398, v399 = range(400)
    if k == 0:
        return alloc(9)  # LINE:big0
    return big(k - 1) + v0  # LINE:bigk


def worker():
    alloc(13)  # LINE:worker1
    alloc(15)  # LINE:worker2


rc = alloc(1)  # LINE:warmup
rc = rc or sum(gen())  # LINE:main-gen
rc = rc or big(7)  # LINE:main-big
rc = rc or sorted([11], key=alloc)[0] - 11  # LINE:main-sorted
rc = rc or run_coro()  # LINE:main-coro
t = threading.Thread(target=worker)
t.start()  # LINE:main-thread
t.join()
# Code objects are read while the process lives: stay a moment.
time.sleep(1)
sys.exit(rc)
