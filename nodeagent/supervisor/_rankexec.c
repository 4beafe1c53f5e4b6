/* Start one rank of an attempt with vfork + exec: what core._become_rank does after os.fork(), in C.
 *
 * Why: a rank started by os.fork() copies the supervisor's page tables, and every object Python touches
 * in the child before exec costs a page copied; the address space is then torn down by exec. Measured
 * end to end, that was the largest single share of a trivial job's CPU (about a fifth). vfork shares the
 * parent's memory until exec, so none of it is paid, and no Python runs in the child: only the system
 * calls below, in the order _become_rank makes them, with its error messages and exit codes.
 *
 * The child runs on the parent's memory: it writes only to its own stack, never returns from spawn(),
 * and ends in execve() or _exit(). Identity changes are raw system calls, not glibc's setuid() family,
 * which would try to change every thread of the process the child shares memory with (glibc's "setxid"
 * broadcast). Signals are blocked in the parent around vfork, so no handler of the supervisor's can run
 * in the child; the child sets every disposition back to SIG_DFL before unblocking them.
 *
 * Optional: where this does not build, core.py forks as before (nodeagent/supervisor/rankexec.py). */

#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define EXIT_COMMAND_NOT_FOUND 127
#define EXIT_COMMAND_NOT_RUNNABLE 126
#define MAX_ERRNO 256
#define MESSAGE_MAX 8192

/* strerror()'s text for every errno, made once at import: the child must not call strerror() (locale). */
static const char *error_text[MAX_ERRNO];

/* What the child needs, all converted before vfork: C strings and arrays the parent owns. */
struct rank_request {
    char *const *argv;
    char *const *envp;
    char *const *path_dirs; /* PATH of the rank's environment, split; NULL when argv[0] has a '/' */
    const char *const *cgroup_procs;
    const char *const *cgroup_prefixes; /* "join the attempt's cgroup '<file>': ", one per file */
    Py_ssize_t cgroup_count;
    const long *cpus;
    Py_ssize_t cpu_count;
    int switch_user;
    uid_t uid;
    gid_t gid;
    const gid_t *groups;
    Py_ssize_t group_count;
    int umask_value; /* -1: keep */
    const char *cwd;
    const char *stdout_path;
    int stdout_truncate;
    const char *stderr_path; /* NULL: the same file as stdout */
    int stderr_truncate;
    int error_fd;
    int rank_number;
    /* Known-in-advance message beginnings, formatted by Python as _describe_exec_failure formats them. */
    const char *switch_prefix;   /* "switch to uid U gid G: " */
    const char *chdir_prefix;    /* "chdir '<cwd>': " */
    const char *stdout_prefix;   /* "open stdout '<path>': " */
    const char *stderr_prefix;   /* "open stderr '<path>': " */
    const char *exec_prefix;     /* "exec '<argv0>': " (argv[0] with a '/') */
    const char *not_found;       /* "exec '<argv0>': command not found" (argv[0] without a '/') */
    const char *stderr_abs;      /* the stderr path when absolute (written to after a chdir/stdout failure) */
};

/* --- the child: async-signal-safe only ------------------------------------------------------------------ */

struct message {
    char text[MESSAGE_MAX];
    size_t length;
};

static void append(struct message *m, const char *s)
{
    while (*s && m->length < sizeof(m->text) - 1)
        m->text[m->length++] = *s++;
}

static void append_char(struct message *m, char c)
{
    if (m->length < sizeof(m->text) - 1)
        m->text[m->length++] = c;
}

static void append_error(struct message *m, int error)
{
    if (error > 0 && error < MAX_ERRNO && error_text[error] != NULL) {
        append(m, error_text[error]);
        return;
    }
    append(m, "Unknown error ");
    char digits[16];
    int n = 0;
    unsigned int value = (unsigned int)error;
    do {
        digits[n++] = (char)('0' + value % 10);
        value /= 10;
    } while (value && n < (int)sizeof(digits));
    while (n)
        append_char(m, digits[--n]);
}

/* Python's repr() of a str, for a path found only in the child (a PATH entry): single quotes unless the
 * text holds one and no double quote; backslash, the quote and control characters escaped. */
static void append_repr(struct message *m, const char *s)
{
    char quote = (strchr(s, '\'') != NULL && strchr(s, '"') == NULL) ? '"' : '\'';
    static const char hex[] = "0123456789abcdef";
    append_char(m, quote);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\' || c == (unsigned char)quote) {
            append_char(m, '\\');
            append_char(m, (char)c);
        } else if (c == '\n') {
            append(m, "\\n");
        } else if (c == '\r') {
            append(m, "\\r");
        } else if (c == '\t') {
            append(m, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            append(m, "\\x");
            append_char(m, hex[c >> 4]);
            append_char(m, hex[c & 15]);
        } else {
            append_char(m, (char)c);
        }
    }
    append_char(m, quote);
}

static void write_all(int fd, const char *data, size_t length)
{
    while (length > 0) {
        ssize_t n = write(fd, data, length);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        data += n;
        length -= (size_t)n;
    }
}

static int open_output(const char *path, int truncate)
{
    return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
}

/* Stages after which a rank whose stderr is not open yet gets its reason written there anyway (as
 * _become_rank: with the user's rights, when the path is absolute). */
enum stage { STAGE_OTHER, STAGE_CHDIR, STAGE_OPEN_STDOUT };

_Noreturn static void fail(const struct rank_request *r, struct message *m, int error, enum stage stage,
                           int privileges_dropped, int stderr_fd)
{
    int code = (error == EACCES || error == EPERM) ? EXIT_COMMAND_NOT_RUNNABLE : EXIT_COMMAND_NOT_FOUND;
    write_all(r->error_fd, m->text, m->length);
    if (stderr_fd < 0 && privileges_dropped && stage != STAGE_OTHER && r->stderr_abs != NULL)
        stderr_fd = open_output(r->stderr_abs, 0);
    if (stderr_fd >= 0) {
        struct message line = {.length = 0};
        char digits[16];
        int n = 0;
        unsigned int value = (unsigned int)r->rank_number;
        append(&line, "garrison: rank ");
        do {
            digits[n++] = (char)('0' + value % 10);
            value /= 10;
        } while (value && n < (int)sizeof(digits));
        while (n)
            append_char(&line, digits[--n]);
        append(&line, ": ");
        m->text[m->length] = '\0';
        append(&line, m->text);
        append_char(&line, '\n');
        write_all(stderr_fd, line.text, line.length);
    }
    _exit(code);
}

_Noreturn static void fail_with(const struct rank_request *r, const char *prefix, int error, enum stage stage,
                                int privileges_dropped, int stderr_fd)
{
    struct message m = {.length = 0};
    append(&m, prefix);
    append_error(&m, error);
    fail(r, &m, error, stage, privileges_dropped, stderr_fd);
}

static int write_pid_zero(const char *path)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, "0", 1);
    int error = errno;
    close(fd);
    if (n != 1) {
        errno = n < 0 ? error : EIO;
        return -1;
    }
    return 0;
}

_Noreturn static void become_rank(const struct rank_request *r)
{
    int privileges_dropped = 0;
    int stderr_fd = -1;

    /* Before anything of the job runs: every process it ever starts is born inside the cgroup. */
    for (Py_ssize_t i = 0; i < r->cgroup_count; i++)
        if (write_pid_zero(r->cgroup_procs[i]) != 0)
            fail_with(r, r->cgroup_prefixes[i], errno, STAGE_OTHER, 0, -1);

    if (setsid() < 0)
        fail_with(r, "setsid: ", errno, STAGE_OTHER, 0, -1);

    /* Every disposition back to the default (ignored ones survive exec; a job must start clean), then an
     * empty mask: the parent blocked everything around vfork. */
    struct sigaction default_action;
    memset(&default_action, 0, sizeof(default_action));
    default_action.sa_handler = SIG_DFL;
    for (int number = 1; number < NSIG; number++) {
        struct sigaction current;
        if (number == SIGKILL || number == SIGSTOP)
            continue;
        if (sigaction(number, NULL, &current) == 0 && current.sa_handler != SIG_DFL)
            sigaction(number, &default_action, NULL);
    }
    sigset_t empty;
    sigemptyset(&empty);
    if (sigprocmask(SIG_SETMASK, &empty, NULL) != 0)
        fail_with(r, "reset signals: ", errno, STAGE_OTHER, 0, -1);

    if (r->cpu_count > 0) {
        cpu_set_t usable, chosen;
        if (sched_getaffinity(0, sizeof(usable), &usable) != 0)
            fail_with(r, "bind to CPUs: ", errno, STAGE_OTHER, 0, -1);
        CPU_ZERO(&chosen);
        for (Py_ssize_t i = 0; i < r->cpu_count; i++)
            if (r->cpus[i] >= 0 && r->cpus[i] < CPU_SETSIZE && CPU_ISSET((int)r->cpus[i], &usable))
                CPU_SET((int)r->cpus[i], &chosen);
        /* Those this host lacks are dropped; with none left the rank keeps the supervisor's. */
        if (sched_setaffinity(0, sizeof(chosen), CPU_COUNT(&chosen) ? &chosen : &usable) != 0)
            fail_with(r, "bind to CPUs: ", errno, STAGE_OTHER, 0, -1);
    }

    if (r->switch_user) {
        if (syscall(SYS_setgroups, (size_t)r->group_count, r->groups) != 0 ||
            syscall(SYS_setresgid, r->gid, r->gid, r->gid) != 0 ||
            syscall(SYS_setresuid, r->uid, r->uid, r->uid) != 0)
            fail_with(r, r->switch_prefix, errno, STAGE_OTHER, 0, -1);
    }
    privileges_dropped = 1;
    if (r->umask_value >= 0)
        umask((mode_t)r->umask_value);

    /* Everything from here on happens with the job user's rights only. */
    if (chdir(r->cwd) != 0)
        fail_with(r, r->chdir_prefix, errno, STAGE_CHDIR, privileges_dropped, stderr_fd);
    int stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (stdin_fd < 0)
        fail_with(r, "open stdin '/dev/null': ", errno, STAGE_OTHER, privileges_dropped, stderr_fd);
    int stdout_fd = open_output(r->stdout_path, r->stdout_truncate);
    if (stdout_fd < 0)
        fail_with(r, r->stdout_prefix, errno, STAGE_OPEN_STDOUT, privileges_dropped, stderr_fd);
    if (r->stderr_path == NULL) {
        stderr_fd = stdout_fd;
    } else {
        stderr_fd = open_output(r->stderr_path, r->stderr_truncate);
        if (stderr_fd < 0)
            fail_with(r, r->stderr_prefix, errno, STAGE_OTHER, privileges_dropped, -1);
    }
    if (dup2(stdin_fd, 0) < 0 || dup2(stdout_fd, 1) < 0 || dup2(stderr_fd, 2) < 0)
        fail_with(r, r->stderr_path == NULL ? "open stdout: " : "open stderr: ", errno, STAGE_OTHER,
                  privileges_dropped, stderr_fd);
    stderr_fd = 2;

    if (r->path_dirs == NULL) {
        execve(r->argv[0], r->argv, r->envp);
        fail_with(r, r->exec_prefix, errno, STAGE_OTHER, privileges_dropped, stderr_fd);
    }
    /* os.execvpe: each PATH entry in turn; the first error other than "not there" wins, else the last. */
    char full[PATH_MAX];
    int saved_error = 0, last_error = ENOENT;
    char saved_path[PATH_MAX], last_path[PATH_MAX];
    saved_path[0] = last_path[0] = '\0';
    size_t name_length = strlen(r->argv[0]);
    for (char *const *dir = r->path_dirs; *dir != NULL; dir++) {
        size_t dir_length = strlen(*dir);
        if (dir_length + 1 + name_length + 1 > sizeof(full)) {
            last_error = ENAMETOOLONG;
            continue;
        }
        if (dir_length == 0) {  /* os.path.join("", name): the name itself */
            memcpy(full, r->argv[0], name_length + 1);
        } else {  /* os.path.join(dir, name): one '/' between them */
            memcpy(full, *dir, dir_length);
            if ((*dir)[dir_length - 1] != '/')
                full[dir_length++] = '/';
            memcpy(full + dir_length, r->argv[0], name_length + 1);
        }
        execve(full, r->argv, r->envp);
        last_error = errno;
        memcpy(last_path, full, strlen(full) + 1);
        if (last_error != ENOENT && last_error != ENOTDIR && saved_error == 0) {
            saved_error = last_error;
            memcpy(saved_path, full, strlen(full) + 1);
        }
    }
    int error = saved_error ? saved_error : last_error;
    const char *path = saved_error ? saved_path : last_path;
    if (error == ENOENT) {
        struct message m = {.length = 0};
        append(&m, r->not_found);
        fail(r, &m, error, STAGE_OTHER, privileges_dropped, stderr_fd);
    }
    struct message m = {.length = 0};
    append(&m, "exec ");
    append_repr(&m, path);
    append(&m, ": ");
    append_error(&m, error);
    fail(r, &m, error, STAGE_OTHER, privileges_dropped, stderr_fd);
}

/* --- the parent: Python objects to C, vfork ----------------------------------------------------------- */

/* Arguments whose storage must outlive the child's exec: kept in one list of bytes objects. */
static char **string_array(PyObject *sequence, PyObject *keep, Py_ssize_t *count)
{
    PyObject *items = PySequence_Fast(sequence, "expected a sequence of bytes");
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    char **array = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (array == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (!PyBytes_Check(item) || PyList_Append(keep, item) != 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "expected bytes");
            PyMem_Free(array);
            Py_DECREF(items);
            return NULL;
        }
        array[i] = PyBytes_AS_STRING(item);
        if ((Py_ssize_t)strlen(array[i]) != PyBytes_GET_SIZE(item)) {
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
            PyMem_Free(array);
            Py_DECREF(items);
            return NULL;
        }
    }
    Py_DECREF(items);
    if (count != NULL)
        *count = n;
    return array;
}

/* A sequence of ints as a C array (freed with PyMem_Free), or NULL with the exception set. */
static long *long_array(PyObject *sequence, const char *what, Py_ssize_t *count)
{
    PyObject *items = PySequence_Fast(sequence, what);
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    long *array = PyMem_Calloc((size_t)n + 1, sizeof(long));
    if (array == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        array[i] = PyLong_AsLong(PySequence_Fast_GET_ITEM(items, i));
    Py_DECREF(items);
    if (PyErr_Occurred()) {
        PyMem_Free(array);
        return NULL;
    }
    *count = n;
    return array;
}

static const char *optional_string(PyObject *object, PyObject *keep)
{
    if (object == Py_None)
        return NULL;
    if (!PyBytes_Check(object)) {
        PyErr_SetString(PyExc_TypeError, "expected bytes or None");
        return NULL;
    }
    if (PyList_Append(keep, object) != 0)
        return NULL;
    return PyBytes_AS_STRING(object);
}

PyDoc_STRVAR(spawn_doc,
"spawn(argv, envp, path_dirs, cgroup_procs, cgroup_prefixes, cpus, switch_user, uid, gid, groups, umask,\n"
"      cwd, stdout, stdout_truncate, stderr, stderr_truncate, error_fd, rank, prefixes) -> pid\n\n"
"Start one rank (see rankexec.py, which builds the arguments). Strings are bytes; path_dirs, stderr and\n"
"prefixes' stderr_abs may be None. prefixes: (switch, chdir, stdout, stderr, exec, not_found, stderr_abs).");

static PyObject *spawn(PyObject *module, PyObject *args)
{
    PyObject *argv_o, *envp_o, *path_o, *procs_o, *cgroup_prefixes_o, *cpus_o, *groups_o, *cwd_o, *stdout_o;
    PyObject *stderr_o, *prefixes_o;
    int switch_user, stdout_truncate, stderr_truncate, error_fd, rank_number, umask_value;
    unsigned int uid, gid;
    if (!PyArg_ParseTuple(args, "OOOOOOpIIOiOOpOpiiO", &argv_o, &envp_o, &path_o, &procs_o, &cgroup_prefixes_o,
                          &cpus_o, &switch_user, &uid, &gid, &groups_o, &umask_value, &cwd_o, &stdout_o,
                          &stdout_truncate, &stderr_o, &stderr_truncate, &error_fd, &rank_number, &prefixes_o))
        return NULL;

    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return NULL;
    struct rank_request r;
    memset(&r, 0, sizeof(r));
    char **argv = NULL, **envp = NULL, **path_dirs = NULL, **procs = NULL, **cgroup_prefixes = NULL;
    char **prefixes = NULL;
    long *cpus = NULL, *group_numbers = NULL;
    gid_t *groups = NULL;
    PyObject *result = NULL;
    Py_ssize_t argc = 0, cgroup_count = 0, prefix_count = 0, cgroup_prefix_count = 0;

    if ((argv = string_array(argv_o, keep, &argc)) == NULL || (envp = string_array(envp_o, keep, NULL)) == NULL)
        goto done;
    if (argc == 0) {
        PyErr_SetString(PyExc_ValueError, "empty argv");
        goto done;
    }
    if (path_o != Py_None && (path_dirs = string_array(path_o, keep, NULL)) == NULL)
        goto done;
    if ((procs = string_array(procs_o, keep, &cgroup_count)) == NULL ||
        (cgroup_prefixes = string_array(cgroup_prefixes_o, keep, &cgroup_prefix_count)) == NULL)
        goto done;
    if (cgroup_prefix_count != cgroup_count) {
        PyErr_SetString(PyExc_ValueError, "one prefix per cgroup.procs file");
        goto done;
    }
    if (!PyTuple_Check(prefixes_o) || PyTuple_GET_SIZE(prefixes_o) != 7) {
        PyErr_SetString(PyExc_TypeError, "prefixes: a tuple of 7");
        goto done;
    }
    prefixes = PyMem_Calloc(7, sizeof(char *));
    if (prefixes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (prefix_count = 0; prefix_count < 7; prefix_count++) {
        PyObject *item = PyTuple_GET_ITEM(prefixes_o, prefix_count);
        if (item == Py_None) {
            prefixes[prefix_count] = NULL;
            continue;
        }
        if ((prefixes[prefix_count] = (char *)optional_string(item, keep)) == NULL)
            goto done;
    }
    if ((cpus = long_array(cpus_o, "cpus: a sequence of ints", &r.cpu_count)) == NULL ||
        (group_numbers = long_array(groups_o, "groups: a sequence of ints", &r.group_count)) == NULL)
        goto done;
    groups = PyMem_Calloc((size_t)r.group_count + 1, sizeof(gid_t));
    if (groups == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < r.group_count; i++)
        groups[i] = (gid_t)group_numbers[i];
    if (!PyBytes_Check(cwd_o) || !PyBytes_Check(stdout_o)) {
        PyErr_SetString(PyExc_TypeError, "cwd and stdout: bytes");
        goto done;
    }
    if (PyList_Append(keep, cwd_o) != 0 || PyList_Append(keep, stdout_o) != 0)
        goto done;
    r.stderr_path = optional_string(stderr_o, keep);
    if (PyErr_Occurred())
        goto done;

    r.argv = argv;
    r.envp = envp;
    r.path_dirs = (strchr(argv[0], '/') != NULL) ? NULL : path_dirs;
    if (r.path_dirs == NULL && strchr(argv[0], '/') == NULL) {
        PyErr_SetString(PyExc_ValueError, "path_dirs is needed for a command without a '/'");
        goto done;
    }
    r.cgroup_procs = (const char *const *)procs;
    r.cgroup_prefixes = (const char *const *)cgroup_prefixes;
    r.cgroup_count = cgroup_count;
    r.cpus = cpus;
    r.switch_user = switch_user;
    r.uid = (uid_t)uid;
    r.gid = (gid_t)gid;
    r.groups = groups;
    r.umask_value = umask_value;
    r.cwd = PyBytes_AS_STRING(cwd_o);
    r.stdout_path = PyBytes_AS_STRING(stdout_o);
    r.stdout_truncate = stdout_truncate;
    r.stderr_truncate = stderr_truncate;
    r.error_fd = error_fd;
    r.rank_number = rank_number;
    r.switch_prefix = prefixes[0] ? prefixes[0] : "switch user: ";
    r.chdir_prefix = prefixes[1] ? prefixes[1] : "chdir: ";
    r.stdout_prefix = prefixes[2] ? prefixes[2] : "open stdout: ";
    r.stderr_prefix = prefixes[3] ? prefixes[3] : "open stderr: ";
    r.exec_prefix = prefixes[4] ? prefixes[4] : "exec: ";
    r.not_found = prefixes[5] ? prefixes[5] : "exec: command not found";
    r.stderr_abs = prefixes[6];

    sigset_t all, previous;
    sigfillset(&all);
    int mask_error = pthread_sigmask(SIG_SETMASK, &all, &previous);
    if (mask_error != 0) {
        errno = mask_error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    pid_t pid = vfork();
    if (pid == 0)
        become_rank(&r);
    int fork_error = errno;
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (pid < 0) {
        errno = fork_error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromLong((long)pid);

done:
    PyMem_Free(argv);
    PyMem_Free(envp);
    PyMem_Free(path_dirs);
    PyMem_Free(procs);
    PyMem_Free(cgroup_prefixes);
    PyMem_Free(prefixes);
    PyMem_Free(cpus);
    PyMem_Free(group_numbers);
    PyMem_Free(groups);
    Py_DECREF(keep);
    return result;
}

static PyMethodDef methods[] = {
    {"spawn", spawn, METH_VARARGS, spawn_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_rankexec", "A rank started with vfork + exec (see rankexec.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rankexec(void)
{
    for (int i = 1; i < MAX_ERRNO; i++) {
        const char *text = strerror(i);
        error_text[i] = text == NULL ? NULL : strdup(text);
    }
    return PyModule_Create(&module_definition);
}
