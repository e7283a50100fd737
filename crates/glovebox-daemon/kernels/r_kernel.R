# Glovebox R kernel: one long-lived R session per code-interpreter context.
#
# Protocol (the same for every kernel; python_kernel.py has the full text): JSON-line
# requests {"id", "code", "env"?, "scoped_env"?} on stdin; JSON-line events on stdout:
# ready {"language": "r"}, then per request stdout/stderr {text}, result {data,
# is_main_result}, error {name, value, traceback} and always, last, end {execution_count}.
# Needs the jsonlite package (Debian: r-cran-jsonlite).
#
# Decisions:
# * Top-level expressions run one by one in the global environment, as at the R prompt:
#   the value of each visible one is printed (print(), so auto-printing matches the
#   console: `[1] "x"`) and sent as a text/plain result, the last one as the main result.
#   What the cell prints itself (print(), cat()) is stdout; messages and warnings are
#   stderr.
# * An error stops the cell: error event named after the condition's first class that is
#   not "simpleError"/"error"/"condition" (else "Error"), value its message, traceback
#   "Error in <call>: <message>" as R shows it.
# * `env` is set with Sys.setenv for good; `scoped_env` only for the cell, then restored.
# * Output is captured with sink(): processes started with system() write straight to the
#   protocol stream, where the daemon skips lines that are not events (their output is lost).
# * SIGINT while a cell runs interrupts it (error KeyboardInterrupt, state kept); SIGINT
#   while idle is ignored.

suppressPackageStartupMessages(library(jsonlite))

.glovebox <- new.env()
# Events go to fd 1 through a connection of their own: sink() diverts stdout() while a
# cell runs, and a warning reported mid-cell must still reach the daemon.
.glovebox$out <- file("/dev/stdout", open = "w", raw = TRUE)
.glovebox$count <- 0L

.glovebox$send <- function(ev) {
  line <- jsonlite::toJSON(ev, auto_unbox = TRUE, null = "null", digits = NA)
  cat(line, "\n", sep = "", file = .glovebox$out)
  flush(.glovebox$out)
}

.glovebox$text <- function(id, stream, lines) {
  if (length(lines) == 0) return(invisible())
  .glovebox$send(list(type = stream, id = id, text = paste0(paste(lines, collapse = "\n"), "\n")))
}

.glovebox$set_env <- function(vars) {
  if (length(vars) == 0) return(invisible())
  do.call(Sys.setenv, as.list(vapply(vars, as.character, "")))
}

.glovebox$error_name <- function(cnd) {
  cls <- setdiff(class(cnd), c("simpleError", "error", "condition"))
  if (inherits(cnd, "interrupt")) return("KeyboardInterrupt")
  if (length(cls) == 0) "Error" else cls[[1]]
}

.glovebox$run <- function(id, code) {
  exprs <- tryCatch(parse(text = code, keep.source = FALSE), error = function(e) e)
  if (inherits(exprs, "error")) {
    msg <- conditionMessage(exprs)
    .glovebox$send(list(type = "error", id = id, name = "SyntaxError", value = msg,
                        traceback = paste("Error in parse:", msg)))
    return(invisible())
  }
  results <- list()
  n <- length(exprs)
  for (i in seq_len(n)) {
    out <- character()
    tc <- textConnection("out", "w", local = TRUE)
    sink(tc)
    failed <- NULL
    shown <- NULL
    tryCatch(
      withCallingHandlers({
        v <- withVisible(eval(exprs[[i]], envir = globalenv()))
        if (v$visible) shown <- utils::capture.output(print(v$value))
      },
      warning = function(w) {
        .glovebox$text(id, "stderr", paste0("Warning message:\n", conditionMessage(w)))
        invokeRestart("muffleWarning")
      },
      message = function(m) {
        .glovebox$text(id, "stderr", sub("\n$", "", conditionMessage(m)))
        invokeRestart("muffleMessage")
      }),
      error = function(e) failed <<- e,
      interrupt = function(e) failed <<- e
    )
    sink()
    close(tc)
    .glovebox$text(id, "stdout", out)
    if (!is.null(shown)) {
      .glovebox$send(list(type = "result", id = id, is_main_result = (i == n),
                          data = list("text/plain" = paste(shown, collapse = "\n"))))
    }
    if (!is.null(failed)) {
      msg <- if (inherits(failed, "interrupt")) "interrupted" else conditionMessage(failed)
      call <- conditionCall(failed)
      # A top-level stop() has the kernel's own eval() as its call.
      if (!is.null(call) && identical(call[[1]], quote(eval))) call <- NULL
      tb <- if (inherits(failed, "interrupt")) {
        "KeyboardInterrupt: interrupted by SIGINT"
      } else if (is.null(call)) {
        paste("Error:", msg)
      } else {
        paste0("Error in ", deparse(call)[[1]], ": ", msg)
      }
      .glovebox$send(list(type = "error", id = id, name = .glovebox$error_name(failed),
                          value = msg, traceback = tb))
      break
    }
  }
}

.glovebox$cell <- function(req) {
  id <- req$id
  .glovebox$count <- .glovebox$count + 1L
  if (!is.null(req$env)) .glovebox$set_env(req$env)
  vars <- req$scoped_env
  saved <- NULL
  if (length(vars) > 0) {
    saved <- Sys.getenv(names(vars), unset = NA, names = TRUE)
    .glovebox$set_env(vars)
  }
  tryCatch(.glovebox$run(id, req$code), interrupt = function(e) {
    .glovebox$send(list(type = "error", id = id, name = "KeyboardInterrupt", value = "interrupted",
                        traceback = "KeyboardInterrupt: interrupted by SIGINT"))
  })
  if (!is.null(saved)) {
    for (k in names(saved)) {
      if (is.na(saved[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, stats::setNames(list(saved[[k]]), k))
    }
    # Variables of the sandbox's environment come back to its value, not to the cell's.
  }
  .glovebox$send(list(type = "end", id = id, execution_count = .glovebox$count))
}

.glovebox$main <- function() {
  input <- file("stdin", open = "r")
  .glovebox$send(list(type = "ready", language = "r"))
  repeat {
    line <- tryCatch(readLines(input, n = 1, warn = FALSE), interrupt = function(e) "")
    if (length(line) == 0) break
    # A SIGINT that came while idle is pending until R next checks for one: take it here,
    # so it neither ends the kernel nor interrupts the next cell.
    tryCatch(Sys.sleep(0.001), interrupt = function(e) NULL)
    if (!nzchar(trimws(line))) next
    req <- tryCatch(jsonlite::fromJSON(line, simplifyVector = FALSE), error = function(e) NULL)
    if (!is.list(req) || !is.character(req$id)) {
      .glovebox$send(list(type = "error", id = NULL, name = "ProtocolError",
                          value = "request is not a JSON object with a string \"id\"", traceback = ""))
      next
    }
    if (!is.character(req$code)) {
      .glovebox$send(list(type = "error", id = req$id, name = "ProtocolError",
                          value = "request needs a string \"code\"", traceback = ""))
      .glovebox$send(list(type = "end", id = req$id, execution_count = .glovebox$count))
      next
    }
    .glovebox$cell(req)
  }
}

.glovebox$main()
