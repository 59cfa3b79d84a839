# Sheepfold R kernel driver. Requests arrive on fd 3 as lines of
# space-separated fields: the marker, then hex-encoded UTF-8: the code and,
# in pairs, the execution's env; messages leave on fd 4 as JSON lines.
# stdout and stderr are the real fds. The cell runs in the global
# environment, top-level expression by top-level expression, as at R's
# prompt: each visible value is a result (its printed text; a data frame
# also as an HTML table), the last one the main result; plots go to a PNG
# device and are results when the cell ends.
local({
  # The default packages, attached here (R starts with none:
  # R_DEFAULT_PACKAGES=NULL) in R's order. utils' .onLoad runs
  # Sys.which("uname"), a shell, which under allow_subprocess: false would
  # be refused (and reported) before any code ran: Sys.which answers "" for
  # the load, and utils' osVersion is read from /etc/os-release as utils
  # does on Linux.
  sw <- Sys.which
  unlockBinding("Sys.which", baseenv())
  assign("Sys.which", function(names) structure(rep("", length(names)), names = names), envir = baseenv())
  for (p in c("methods", "datasets", "utils", "grDevices", "graphics", "stats")) {
    suppressWarnings(library(p, character.only = TRUE))
  }
  assign("Sys.which", sw, envir = baseenv())
  lockBinding("Sys.which", baseenv())
  if (file.exists("/etc/os-release")) {
    pretty <- grep("^PRETTY_NAME=", readLines("/etc/os-release", warn = FALSE), value = TRUE)
    if (length(pretty)) {
      u <- asNamespace("utils")
      unlockBinding("osVersion", u)
      assign("osVersion", gsub("^PRETTY_NAME=\"?|\"$", "", pretty[1]), envir = u)
      lockBinding("osVersion", u)
    }
  }
  req <- file("/proc/self/fd/3", open = "r", blocking = TRUE)
  msg <- file("/proc/self/fd/4", open = "w", blocking = TRUE)
  max_result <- 3500000
  hexdec <- function(h) {
    if (!nzchar(h)) return("")
    n <- nchar(h)
    s <- rawToChar(as.raw(strtoi(substring(h, seq(1, n, 2), seq(2, n, 2)), 16L)))
    Encoding(s) <- "UTF-8"
    s
  }
  jstr <- function(s) {
    s <- iconv(enc2utf8(paste(as.character(s), collapse = "\n")), "UTF-8", "UTF-8", sub = "?")
    s <- gsub("\\", "\\\\", s, fixed = TRUE)
    s <- gsub("\"", "\\\"", s, fixed = TRUE)
    s <- gsub("\n", "\\n", s, fixed = TRUE)
    s <- gsub("\r", "\\r", s, fixed = TRUE)
    s <- gsub("\t", "\\t", s, fixed = TRUE)
    if (grepl("[\001-\037]", s, useBytes = TRUE)) {
      cp <- utf8ToInt(s)
      parts <- ifelse(cp < 32L, sprintf("\\u%04x", cp), intToUtf8(cp, multiple = TRUE))
      s <- paste(parts, collapse = "")
    }
    paste0("\"", s, "\"")
  }
  send <- function(s) {
    n <- nchar(s, type = "bytes")
    if (n > max_result) {
      what <- if (startsWith(s, "{\"type\":\"error\"")) "error" else "result"
      s <- sprintf("{\"type\":\"dropped\",\"what\":\"%s\",\"bytes\":%.0f,\"limit\":%d}", what, n, max_result)
    }
    writeLines(s, msg, useBytes = TRUE)
    flush(msg)
  }
  b64chars <- c(LETTERS, letters, 0:9, "+", "/")
  b64 <- function(r) {
    n <- length(r)
    if (n == 0) return("")
    pad <- (3 - n %% 3) %% 3
    v <- matrix(c(as.integer(r), integer(pad)), nrow = 3)
    v <- v[1, ] * 65536L + v[2, ] * 256L + v[3, ]
    idx <- rbind(v %/% 262144L, (v %/% 4096L) %% 64L, (v %/% 64L) %% 64L, v %% 64L)
    out <- b64chars[idx + 1L]
    if (pad > 0) out[(length(out) - pad + 1):length(out)] <- "="
    paste(out, collapse = "")
  }
  esc <- function(x) {
    x <- gsub("&", "&amp;", x, fixed = TRUE)
    x <- gsub("<", "&lt;", x, fixed = TRUE)
    gsub(">", "&gt;", x, fixed = TRUE)
  }
  # html renders a data frame (or a matrix) as a table, at most 100 rows.
  html <- function(x) {
    df <- as.data.frame(x, stringsAsFactors = FALSE)
    shown <- utils::head(df, 100L)
    cells <- vapply(shown, function(col) esc(format(col)), character(nrow(shown)))
    if (!is.matrix(cells)) cells <- matrix(cells, nrow = nrow(shown))
    rows <- if (nrow(shown) > 0) {
      paste0("<tr><th>", esc(rownames(shown)), "</th>",
             apply(cells, 1, function(r) paste0("<td>", r, "</td>", collapse = "")), "</tr>", collapse = "\n")
    } else ""
    types <- vapply(df, function(col) class(col)[1], "")
    head <- paste0("<thead><tr><th></th>", paste0("<th>", esc(names(df)), "</th>", collapse = ""), "</tr>",
                   "<tr><th></th>", paste0("<th>&lt;", esc(types), "&gt;</th>", collapse = ""), "</tr></thead>")
    more <- if (nrow(df) > nrow(shown)) sprintf("<p>%d rows, %d shown</p>", nrow(df), nrow(shown)) else ""
    paste0("<table class=\"dataframe\">", head, "<tbody>\n", rows, "\n</tbody></table>", more)
  }
  result <- function(value, main) {
    text <- paste(utils::capture.output(print(value)), collapse = "\n")
    fields <- paste0("\"text\":", jstr(text))
    if (is.data.frame(value) || is.matrix(value)) fields <- paste0(fields, ",\"html\":", jstr(html(value)))
    send(paste0("{\"type\":\"result\",\"result\":{", fields, ",\"is_main_result\":", if (main) "true" else "false", "}}"))
  }
  plotdir <- tempfile("sheepfold-plots-")
  dir.create(plotdir)
  pngdev <- function(...) grDevices::png(file.path(plotdir, "plot%03d.png"), width = 640, height = 480, type = "cairo")
  options(device = pngdev, warn = 1, width = 120)
  # plots closes the devices a cell opened and sends each page drawn.
  plots <- function() {
    while (grDevices::dev.cur() > 1) grDevices::dev.off()
    for (f in sort(list.files(plotdir, full.names = TRUE))) {
      data <- readBin(f, "raw", file.info(f)$size)
      unlink(f)
      send(paste0("{\"type\":\"result\",\"result\":{\"png\":\"", b64(data), "\",\"text\":\"<plot>\"}}"))
    }
  }
  # frames are the calls of the user's code: those below the cell's eval,
  # without the error's own signalling.
  cell <- quote(eval(exprs[[i]], envir = globalenv()))
  frames <- function(calls) {
    at <- which(vapply(calls, function(cl) identical(cl, cell), TRUE))
    if (length(at)) calls <- calls[-seq_len(max(at))]
    keep <- Filter(function(cl) !(is.call(cl) && is.name(cl[[1]]) &&
                                   as.character(cl[[1]]) %in% c("h", ".handleSimpleError", "stop", "signalCondition", "withOneRestart", "withRestarts", "doWithOneRestart")), calls)
    paste(vapply(keep, function(cl) paste(deparse(cl, nlines = 1L), collapse = ""), ""), collapse = "\n")
  }
  run <- function(code) {
    exprs <- tryCatch(parse(text = code, keep.source = FALSE), error = function(e) e)
    if (inherits(exprs, "error")) {
      m <- sub("^<text>:", "line ", conditionMessage(exprs))
      send(paste0("{\"type\":\"error\",\"error\":{\"name\":\"SyntaxError\",\"value\":", jstr(m), ",\"traceback\":", jstr(m), "}}"))
      return(invisible())
    }
    visible <- list()
    flushed <- 0L
    for (i in seq_along(exprs)) {
      tb <- NULL
      out <- tryCatch(withCallingHandlers(
        withVisible(eval(exprs[[i]], envir = globalenv())),
        error = function(e) tb <<- frames(sys.calls()),
        warning = function(w) {
          cat("Warning message:\n", conditionMessage(w), "\n", sep = "", file = stderr())
          invokeRestart("muffleWarning")
        }), error = function(e) e, interrupt = function(e) e)
      if (inherits(out, "condition")) {
        for (v in visible) result(v$value, FALSE)
        plots()
        if (inherits(out, "interrupt")) {
          send("{\"type\":\"error\",\"error\":{\"name\":\"KeyboardInterrupt\",\"value\":\"interrupted\",\"traceback\":\"\"}}")
        } else {
          call <- conditionCall(out)
          where <- if (is.null(call) || identical(call, cell)) "Error: " else paste0("Error in ", paste(deparse(call, nlines = 1L), collapse = ""), ": ")
          trace <- paste0(where, conditionMessage(out), if (length(tb) && nzchar(tb)) paste0("\n", tb) else "")
          send(paste0("{\"type\":\"error\",\"error\":{\"name\":", jstr(class(out)[1]), ",\"value\":",
                      jstr(conditionMessage(out)), ",\"traceback\":", jstr(trace), "}}"))
        }
        return(invisible())
      }
      if (out$visible) visible[[length(visible) + 1L]] <- out
    }
    n <- length(visible)
    for (j in seq_len(n)) result(visible[[j]]$value, j == n)
    plots()
  }
  repeat {
    line <- readLines(req, n = 1L, warn = FALSE)
    if (length(line) == 0L) break
    f <- strsplit(line, " ", fixed = TRUE)[[1]]
    marker <- f[1]
    code <- hexdec(f[2])
    saved <- list()
    field <- function(i) if (i <= length(f)) f[i] else ""
    for (j in seq_len(as.integer(f[3]))) {
      k <- hexdec(field(2L + 2L * j))
      saved[[k]] <- Sys.getenv(k, unset = NA)
      args <- list(hexdec(field(3L + 2L * j)))
      names(args) <- k
      do.call(Sys.setenv, args)
    }
    tryCatch(run(code), error = function(e) {
      send(paste0("{\"type\":\"error\",\"error\":{\"name\":", jstr(class(e)[1]), ",\"value\":", jstr(conditionMessage(e)), ",\"traceback\":\"\"}}"))
    }, interrupt = function(e) {
      send("{\"type\":\"error\",\"error\":{\"name\":\"KeyboardInterrupt\",\"value\":\"interrupted\",\"traceback\":\"\"}}")
    })
    for (k in names(saved)) {
      if (is.na(saved[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, stats::setNames(list(saved[[k]]), k))
    }
    flush(stdout())
    flush(stderr())
    cat("\036", marker, "\n", sep = "")
    cat("\036", marker, "\n", sep = "", file = stderr())
    flush(stdout())
    flush(stderr())
    send("{\"type\":\"done\"}")
  }
  quit(save = "no", status = 0)
})
