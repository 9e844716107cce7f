/* agentrun-runner: starts the runner's Python isolated from the environment it was given.
 *
 * A run's creator writes part of the runner's environment (spec.env). Admission refuses the
 * variables that change how a process loads or runs code; this launcher is the line behind
 * it, for a runner started some other way (a CRD not yet upgraded, a pod made by hand). It
 * removes every such variable (agentrun/vocabulary.py, LoaderEnv: the two lists below must
 * stay equal to it, tests/unit/test_runner_launcher.py checks), sets PATH to the one this
 * launcher was built with, and replaces itself with
 *
 *     RUNNER_PYTHON -I -B -u -m agentrun_runner ARGS...
 *
 * -I: Python reads no PYTHON* variable, adds neither the user's site directory nor the
 * current one to sys.path. -B and -u: what PYTHONDONTWRITEBYTECODE and PYTHONUNBUFFERED did
 * before -I made Python ignore them (a read-only image; logs that reach the node at once).
 *
 * Built static (gcc -static): in a dynamically linked program the loader honours LD_PRELOAD
 * and LD_AUDIT before the first instruction of ours, so that scrubbing them would be too late.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef RUNNER_PYTHON
#error "build with -DRUNNER_PYTHON='\"/path/to/python\"' (the Python that has agentrun_runner)"
#endif
#ifndef RUNNER_PATH
#error "build with -DRUNNER_PATH='\"/usr/bin:/bin\"' (the PATH the runner gets)"
#endif

extern char **environ;

static const char *const refused_prefixes[] = {
    "PYTHON", "LD_", "DYLD_", "BASH_FUNC_", "OPENSSL_",
};

static const char *const refused_names[] = {
    "PATH", "BROWSER", "GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES",
    "GLIBC_TUNABLES", "GCONV_PATH", "GETCONF_DIR", "LOCPATH", "NLSPATH", "MALLOC_TRACE",
    "TZDIR", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "RESOLV_HOST_CONF", "NIS_PATH",
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4",
    "NODE_OPTIONS", "NODE_PATH", "PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB",
    "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS",
    "CLASSPATH",
};

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* Whether an environment entry ("NAME=value", or a bare "NAME") is one of the refused. */
static int refused(const char *entry) {
    size_t name_length = strcspn(entry, "=");
    for (size_t i = 0; i < COUNT(refused_prefixes); i++) {
        size_t length = strlen(refused_prefixes[i]);
        if (name_length >= length && strncmp(entry, refused_prefixes[i], length) == 0)
            return 1;
    }
    for (size_t i = 0; i < COUNT(refused_names); i++) {
        if (strlen(refused_names[i]) == name_length &&
            strncmp(entry, refused_names[i], name_length) == 0)
            return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    static const char *const python_args[] = {RUNNER_PYTHON, "-I", "-B", "-u", "-m",
                                              "agentrun_runner"};
    size_t entries = 0;
    while (environ[entries] != NULL)
        entries++;
    /* A new array: entries may repeat a name, and every copy must go. */
    char **env = calloc(entries + 2, sizeof *env);
    char **args = calloc(COUNT(python_args) + (size_t)argc, sizeof *args);
    if (env == NULL || args == NULL) {
        fputs("agentrun-runner: out of memory\n", stderr);
        return 127;
    }
    size_t kept = 0;
    for (size_t i = 0; i < entries; i++) {
        if (!refused(environ[i]))
            env[kept++] = environ[i];
    }
    env[kept] = (char *)"PATH=" RUNNER_PATH;
    for (size_t i = 0; i < COUNT(python_args); i++)
        args[i] = (char *)python_args[i];
    for (int i = 1; i < argc; i++)
        args[COUNT(python_args) + (size_t)i - 1] = argv[i];
    execve(RUNNER_PYTHON, args, env);
    fprintf(stderr, "agentrun-runner: cannot start %s: %s\n", RUNNER_PYTHON, strerror(errno));
    return 127;
}
