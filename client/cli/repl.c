/*
 * repl.c - the interactive prompt of `shardkv` (no command, on a terminal):
 * libedit for line editing and history, kv_cli_split_line to turn a line
 * into words, and kv_cli_main to run them exactly as on the command line.
 */
#include "client/cli/cli.h"

#include <editline/readline.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORDS 4096 /* words of one line */

int
kv_cli_split_line(const char *line, char ***argvp, char **bufp, char *err, size_t errlen)
{
	size_t len = strlen(line);
	char *buf = malloc(len + 1), *o = buf;
	char **argv = calloc(MAX_WORDS + 1, sizeof(char *));
	int n = 1;
	const char *p = line;

	if (buf == NULL || argv == NULL) {
		snprintf(err, errlen, "out of memory");
		goto bad;
	}
	argv[0] = "shardkv";
	for (;;) {
		bool in_word = false;
		char *start = o;

		while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
			p++;
		if (*p == 0)
			break;
		while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
			in_word = true;
			if (*p == '\'') {
				const char *q = strchr(p + 1, '\'');
				if (q == NULL) {
					snprintf(err, errlen, "unterminated ' quote");
					goto bad;
				}
				memcpy(o, p + 1, (size_t)(q - p - 1));
				o += q - p - 1;
				p = q + 1;
			} else if (*p == '"') {
				p++;
				while (*p && *p != '"') {
					if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
						p++;
					*o++ = *p++;
				}
				if (*p != '"') {
					snprintf(err, errlen, "unterminated \" quote");
					goto bad;
				}
				p++;
			} else if (*p == '\\' && p[1] != 0) {
				*o++ = p[1];
				p += 2;
			} else {
				*o++ = *p++;
			}
		}
		if (!in_word)
			break;
		if (n == MAX_WORDS) {
			snprintf(err, errlen, "more than %d words", MAX_WORDS - 1);
			goto bad;
		}
		*o++ = 0;
		argv[n++] = start;
	}
	*argvp = argv;
	*bufp = buf;
	return n;
bad:
	free(buf);
	free(argv);
	return -1;
}

int
kv_cli_repl(int argc, char **argv, FILE *out, FILE *err)
{
	char hist[1024] = "";
	const char *home = getenv("HOME");
	char *line;

	if (home != NULL && home[0] != 0) {
		snprintf(hist, sizeof(hist), "%s/.shardkv_history", home);
		read_history(hist);
	}
	fprintf(out,
	        "shardkv: type a command as on the command line (help: --help, leave: quit)\n");
	fflush(out);
	while ((line = readline("shardkv> ")) != NULL) {
		char **words, *buf, msg[128];
		int n = kv_cli_split_line(line, &words, &buf, msg, sizeof(msg));

		if (n < 0) {
			fprintf(err, "shardkv: %s\n", msg);
		} else if (n > 1 &&
		           (strcmp(words[1], "quit") == 0 || strcmp(words[1], "exit") == 0)) {
			free(words);
			free(buf);
			free(line);
			break;
		} else if (n > 1) {
			/* The global options of the prompt's own command line come
			 * first; a line's own options may override them. */
			char **v = calloc((size_t)argc + (size_t)n, sizeof(char *));
			int k = 0, rc;
			if (v == NULL) {
				fprintf(err, "shardkv: out of memory\n");
			} else {
				v[k++] = words[0];
				for (int i = 1; i < argc; i++)
					v[k++] = argv[i];
				for (int i = 1; i < n; i++)
					v[k++] = words[i];
				add_history(line);
				rc = kv_cli_main(k, v, out, err);
				fflush(out);
				clearerr(stdin); /* a `-` value read up to Ctrl-D */
				if (rc != 0)
					fprintf(err, "(exit %d)\n", rc);
				free(v);
			}
		}
		if (n >= 1) {
			free(words);
			free(buf);
		}
		free(line);
	}
	if (line == NULL)
		fputc('\n', out);
	if (hist[0] != 0)
		write_history(hist);
	return 0;
}
