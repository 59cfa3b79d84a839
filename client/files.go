package client

import (
	"context"
	"io"
	"mime/multipart"
	"net/url"
	"strconv"

	"github.com/sheepfold/sheepfold/api"
)

// FileInfo describes a path in a sandbox; Metadata holds the E2B
// metadata a file was written with, when it has some.
type FileInfo = api.FileInfo

// Paths are absolute or relative to /home/user; none leads out of the sandbox.

func fileQuery(path string) url.Values { return url.Values{"path": {path}} }

// WriteFile writes r to a file (atomically), creating its parents.
func (c *Client) WriteFile(ctx context.Context, sandboxID, path string, r io.Reader) (*FileInfo, error) {
	var fi FileInfo
	return &fi, c.call(ctx, request{method: "PUT", path: sandboxPath(sandboxID, "files"), query: fileQuery(path),
		body: r, contentType: "application/octet-stream"}, &fi)
}

// ReadFile returns a file's contents.
func (c *Client) ReadFile(ctx context.Context, sandboxID, path string) ([]byte, error) {
	rc, err := c.OpenFile(ctx, sandboxID, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// OpenFile streams a file's contents; the caller closes it.
func (c *Client) OpenFile(ctx context.Context, sandboxID, path string) (io.ReadCloser, error) {
	res, err := c.do(ctx, request{method: "GET", path: sandboxPath(sandboxID, "files"), query: fileQuery(path)})
	if err != nil {
		return nil, err
	}
	return res.Body, nil
}

// ListFiles lists a directory, every page of it; depth 1 lists its
// children, more recurses. Entries come in a stable order: each
// directory's by name, a directory's contents right after it.
func (c *Client) ListFiles(ctx context.Context, sandboxID, path string, depth int) ([]FileInfo, error) {
	var all []FileInfo
	q := FileListQuery{Depth: depth}
	for {
		p, err := c.ListFilesPage(ctx, sandboxID, path, q)
		if err != nil {
			return nil, err
		}
		all = append(all, p.Entries...)
		if p.NextCursor == "" {
			return all, nil
		}
		q.Cursor = p.NextCursor
	}
}

// FileListQuery selects a page of a directory listing.
type FileListQuery struct {
	Depth  int    // 1 (or 0) lists the children, more recurses (at most 32)
	Limit  int    // at most this many entries (1 to 10000); 0 for the server's page size
	Cursor string // the previous page's NextCursor, for the same path and depth; "" from the start
}

// FileListPage is one page of a directory listing.
type FileListPage struct {
	Entries []FileInfo
	// NextCursor continues the listing (FileListQuery.Cursor); empty on
	// the last page.
	NextCursor string
}

// ListFilesPage lists one page of a directory.
func (c *Client) ListFilesPage(ctx context.Context, sandboxID, path string, q FileListQuery) (*FileListPage, error) {
	v := fileQuery(path)
	if q.Depth > 0 {
		v.Set("depth", strconv.Itoa(q.Depth))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	var out struct {
		Entries    []FileInfo `json:"entries"`
		NextCursor *string    `json:"next_cursor"`
	}
	if err := c.call(ctx, request{method: "GET", path: sandboxPath(sandboxID, "files", "list"), query: v}, &out); err != nil {
		return nil, err
	}
	p := &FileListPage{Entries: out.Entries}
	if out.NextCursor != nil {
		p.NextCursor = *out.NextCursor
	}
	return p, nil
}

// StatFile describes a path.
func (c *Client) StatFile(ctx context.Context, sandboxID, path string) (*FileInfo, error) {
	var fi FileInfo
	return &fi, c.call(ctx, request{method: "GET", path: sandboxPath(sandboxID, "files", "stat"), query: fileQuery(path)}, &fi)
}

// MakeDir creates a directory and its parents.
func (c *Client) MakeDir(ctx context.Context, sandboxID, path string) (*FileInfo, error) {
	var fi FileInfo
	return &fi, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "files", "mkdir"),
		json: api.PathRequest{Path: path}}, &fi)
}

// RemoveFile removes a file, or a directory with everything in it.
func (c *Client) RemoveFile(ctx context.Context, sandboxID, path string) error {
	return c.call(ctx, request{method: "DELETE", path: sandboxPath(sandboxID, "files"), query: fileQuery(path)}, nil)
}

// MoveFile renames a path, creating the target's parents.
func (c *Client) MoveFile(ctx context.Context, sandboxID, from, to string) (*FileInfo, error) {
	var fi FileInfo
	return &fi, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "files", "move"),
		json: api.MoveRequest{From: from, To: to}}, &fi)
}

// Upload is one file of UploadFiles.
type Upload struct {
	Name   string // base name in the target directory
	Reader io.Reader
}

// UploadFiles writes files into dir with one multipart request, streaming
// their contents.
func (c *Client) UploadFiles(ctx context.Context, sandboxID, dir string, files ...Upload) ([]FileInfo, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		for _, f := range files {
			w, err := mw.CreateFormFile("file", f.Name)
			if err == nil {
				_, err = io.Copy(w, f.Reader)
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.CloseWithError(mw.Close())
	}()
	defer pr.Close()
	var out struct {
		Files []FileInfo `json:"files"`
	}
	return out.Files, c.call(ctx, request{method: "POST", path: sandboxPath(sandboxID, "files"), query: fileQuery(dir),
		body: pr, contentType: mw.FormDataContentType()}, &out)
}
